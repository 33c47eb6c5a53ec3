"""The archiver's Spark driver (a local master) listens on loopback only, as everything else `make serve` starts does:
its RPC and block manager ports have no authentication (spark.authenticate is off)."""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Any

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's st column


def _address(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    # /proc/net/tcp{,6} print the address as 32-bit words in the kernel's (little-endian) byte order.
    words = [bytes.fromhex(hex_address[i : i + 8])[::-1] for i in range(0, len(hex_address), 8)]
    return ipaddress.ip_address(b"".join(words))


def listening_addresses(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket process `pid` listens on."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        match = re.fullmatch(r"socket:\[(\d+)\]", os.readlink(fd))
        if match:
            inodes.add(match.group(1))
    out = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == _LISTEN and inode in inodes:
                host, port = local.split(":")
                out.append((str(_address(host)), int(port, 16)))
    return out


def _is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return (mapped or ip).is_loopback


def test_the_driver_jvm_listens_on_loopback_only(lake_spark: Any) -> None:
    pid = int(lake_spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())

    addresses = listening_addresses(pid)

    assert len(addresses) >= 2, addresses  # at least the driver's RPC port and the py4j gateway
    assert all(_is_loopback(host) for host, _port in addresses), addresses
