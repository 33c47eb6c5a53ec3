"""Kafka's own Java client and tools (tests/support/java.py): the drivers compiled once per session (per xdist worker).

Tests using `kafka_java` are marked `java` (tests/conftest.py): they start JVMs, so `make test-quick` (no JVM)
deselects them, and under ICELOG_TESTS_NO_JVM the refusing `java` on the PATH fails them, as it fails an unmarked
Spark test.
"""

from __future__ import annotations

import os

import pytest

from tests.conftest import NO_JVM_ENV
from tests.support.java import KafkaJava


@pytest.fixture(scope="session")
def kafka_java(tmp_path_factory: pytest.TempPathFactory) -> KafkaJava:
    if os.environ.get(NO_JVM_ENV):  # before javac: one clear line instead of a JVM that refuses to start
        pytest.fail(f"{NO_JVM_ENV} is set: this lane starts no JVM, and tests of Kafka's Java client and tools are "
                    "marked java (deselect them with -m 'not java', as make test-quick does)", pytrace=False)
    return KafkaJava(tmp_path_factory.mktemp("java-classes"))
