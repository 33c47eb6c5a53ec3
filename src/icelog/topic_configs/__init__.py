"""Topic config keys by owner: Kafka's own (`icelog.topics`), `icelog.archive.*` and `icelog.schema.*`.

These modules only declare keys, defaults, validators and their typed resolution, and import nothing above
the config layer, so the broker (validation, retention, enforcement) and the archiver read a topic's configs
the same way without the log importing the lake or the lake importing the log.
"""
