"""Kafka's v2 record batches: the header layout, varints, the record walker (compiled, with a pure-Python twin) and
batch validation. Depends on nothing of icelog but its errors: the log, the wire, the schema layer, the archive and
read-back all read and write batches through it."""
