"""Coordinators: consumer groups (classic protocol) and transactions. They know nothing of the wire codec."""
