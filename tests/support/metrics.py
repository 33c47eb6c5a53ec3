"""Scraping a test broker's /metrics: samples by name and labels, the exported names, promtool's verdict."""

from __future__ import annotations

import subprocess
import urllib.request
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}


def scrape_text(metrics_url: str) -> str:
    with urllib.request.urlopen(f"{metrics_url}/metrics", timeout=30) as response:
        return str(response.read().decode())


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample: (name, labels) -> value."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text) for s in family.samples
    }


def value(text: str, name: str, **labels: Any) -> float:
    """The sum of the samples of `name` whose labels include `labels` (0 if none)."""
    wanted = {(k, str(v)) for k, v in labels.items()}
    return sum(v for (n, got), v in samples(text).items() if n == name and wanted <= got)


def exported_names(text: str) -> set[str]:
    """Every series name the text declares (from its # TYPE lines, with each type's suffixes)."""
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            names.add(name)
            names.update(name + suffix for suffix in SUFFIXES.get(kind, ()))
    return names


def promtool_check(text: str) -> subprocess.CompletedProcess[str]:
    """`promtool check metrics` on the text (Debian's prometheus package; scripts/setup.sh installs it)."""
    return subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
