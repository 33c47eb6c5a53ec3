"""Several brokers over one metadata store and one bucket (issue 46): who is in the cluster, who leads each
partition and each coordinator shard (view.py), and the loop that keeps a broker's share of them (controller.py)."""
