"""Replay: an archive table's records produced into a topic (`icelog replay`)."""
