"""Who a client is and what it may do: SASL and SCRAM credentials, Kafka's ACL model and its authorizer.

Used by the Kafka listener (wire), the schema registry and the CLI; keeps its state in the metadata store's
SecurityStore slice (meta/security.py).
"""
