"""What the tests share that is not a fixture: a broker process, clients, hand-built records, archive helpers, and
the scripts tests run as child processes (copy_job.py, group_member.py). Fixtures are in tests/conftest.py."""
