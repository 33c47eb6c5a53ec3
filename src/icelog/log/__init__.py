"""The intake log: durable group-committed appends, reads by offset, recovery and retention."""
