"""`icelog sql --live` replaces the archive tables a query names by views of their live cuts, and nothing else:
names inside string literals and comments, columns (kafka.offset) and other tables stay as written."""

from __future__ import annotations

from icelog.live.query import replace_tables

TABLES = {("icelog", "orders"): "orders", ("icelog", "orders-v2"): "orders-v2", ("sales", "Items"): "items"}


def live(query: str) -> tuple[str, list[str]]:
    return replace_tables(query, TABLES, "lake", lambda topic: f"<{topic}>")


def test_two_and_three_part_names_bare_or_back_quoted() -> None:
    assert live("SELECT kafka.offset FROM icelog.orders") == ("SELECT kafka.offset FROM <orders>", ["orders"])
    assert live("SELECT * FROM lake.icelog.`orders-v2` o JOIN `icelog` . `orders` p ON o.key = p.key") == (
        "SELECT * FROM <orders-v2> o JOIN <orders> p ON o.key = p.key", ["orders-v2", "orders"])
    assert live("select count(*) from LAKE.Sales.items, icelog.orders") == (
        "select count(*) from <items>, <orders>", ["items", "orders"])


def test_literals_comments_other_catalogs_and_other_tables_are_left_alone() -> None:
    query = ("SELECT 'icelog.orders', \"icelog.orders\" -- icelog.orders\n"
             "FROM other.icelog.orders, icelog.customers /* icelog.orders */ WHERE x = 'it''s icelog.orders'")
    assert live(query) == (query, [])
    assert live("SELECT `icelog.orders` FROM t") == ("SELECT `icelog.orders` FROM t", [])
