"""`icelog user add|list|delete`, run as the real command against a data directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from icelog.meta.sqlite import SqliteStore
from icelog.security.credentials import check_plain


def icelog(*args: str, stdin: str = "", cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ICELOG_")}
    return subprocess.run([sys.executable, "-m", "icelog", *args], input=stdin, capture_output=True, text=True,
                          timeout=60, env=env, cwd=cwd)


def test_add_list_delete(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    added = icelog("user", "add", "alice", "--password-stdin", "--data-dir", data, stdin="s3cret pass\n")
    assert added.returncode == 0, added.stderr
    assert "alice added: SCRAM-SHA-256, SCRAM-SHA-512 (4096 iterations)" in added.stdout
    assert "s3cret" not in added.stdout + added.stderr
    one = icelog("user", "add", "bob", "--mechanism", "SCRAM-SHA-512", "--iterations", "8192", "--password-stdin",
                 "--data-dir", data, stdin="pw")  # no line end: fine too
    assert one.returncode == 0, one.stderr

    listed = icelog("user", "list", "--data-dir", data)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split("\n")[:4] == [
        "USER   MECHANISM      ITERATIONS",
        "alice  SCRAM-SHA-256  4096",
        "alice  SCRAM-SHA-512  4096",
        "bob    SCRAM-SHA-512  8192",
    ]
    store = SqliteStore(Path(data) / "meta.db")
    try:
        # the line end is not part of the password; PLAIN checks against either credential
        assert check_plain(store, "alice", "s3cret pass") and not check_plain(store, "alice", "s3cret pass\n")
        assert check_plain(store, "bob", "pw")
        for credential in store.scram_credentials():
            assert credential.stored_key.hex() not in listed.stdout

        # the password changes while another process (a broker) holds the store open
        changed = icelog("user", "add", "alice", "--password-stdin", "--data-dir", data, stdin="new\n")
        assert changed.returncode == 0 and "alice updated" in changed.stdout
        assert check_plain(store, "alice", "new") and not check_plain(store, "alice", "s3cret pass")

        one_mech = icelog("user", "delete", "alice", "--mechanism", "SCRAM-SHA-256", "--data-dir", data)
        assert one_mech.returncode == 0 and "SCRAM-SHA-512 left" in one_mech.stdout
        gone = icelog("user", "delete", "alice", "--data-dir", data)
        assert gone.returncode == 0 and "user alice deleted" in gone.stdout
        assert not check_plain(store, "alice", "new")
        assert [c.user for c in store.scram_credentials()] == ["bob"]
    finally:
        store.close()

    missing = icelog("user", "delete", "alice", "--data-dir", data)
    assert missing.returncode == 1
    assert "no user 'alice'; `icelog user list` shows the users" in missing.stderr


def test_refusals_say_the_fix(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    empty = icelog("user", "add", "alice", "--password-stdin", "--data-dir", data, stdin="\n")
    assert empty.returncode == 2 and "the password is empty; pipe it on stdin" in empty.stderr
    bad_name = icelog("user", "add", "al ice", "--password-stdin", "--data-dir", data, stdin="pw\n")
    assert bad_name.returncode == 2 and "without spaces" in bad_name.stderr
    few = icelog("user", "add", "alice", "--iterations", "100", "--password-stdin", "--data-dir", data, stdin="pw\n")
    assert few.returncode == 2 and "use 4096 to 16384" in few.stderr
    mech = icelog("user", "add", "alice", "--mechanism", "PLAIN", "--password-stdin", "--data-dir", data)
    assert mech.returncode == 2 and "invalid choice" in mech.stderr
    no_stdin_flag = icelog("user", "add", "alice", "--data-dir", data)
    assert no_stdin_flag.returncode == 2 and "--password-stdin" in no_stdin_flag.stderr
    assert not (tmp_path / "data" / "meta.db").exists()  # refused before the store was opened
    nothing = icelog("user", "list", "--data-dir", str(tmp_path / "elsewhere"))
    assert nothing.returncode == 2 and "no meta.db" in nothing.stderr


def test_config_file_names_the_data_dir(tmp_path: Path) -> None:
    (tmp_path / "icelog.yaml").write_text(f"data_dir: {tmp_path / 'from-config'}\n")
    added = icelog("user", "add", "carol", "--password-stdin", "--config", str(tmp_path / "icelog.yaml"), stdin="pw\n")
    assert added.returncode == 0, added.stderr
    listed = icelog("--config", str(tmp_path / "icelog.yaml"), "user", "list")
    assert "carol" in listed.stdout
    assert (tmp_path / "from-config" / "meta.db").exists()
