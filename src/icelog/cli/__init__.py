"""The `icelog` command line."""
