"""Schema registry and data-enforcement benchmark.

Run: .venv/bin/python bench/registry_bench.py [--lookups 2000] [--records 100000]
Measures, against one fresh broker (its embedded registry), after a warm-up so every cache is warm:
- schema look-up latency p50/p99 with the client-side cache OFF (every look-up is an HTTP request that
  the broker answers from its own caches): GET /schemas/ids/{id}, GET /schemas/ids/{id}?format=serialized
  (what ProtobufDeserializer asks for) and GET /subjects/{s}/versions/latest, over one keep-alive
  connection; next to the client-side cache ON (confluent-kafka's SchemaRegistryClient.get_schema);
- the broker-side look-up that produce-time enforcement does per record (Enforcer: latest id + parser,
  both cached), in process;
- produce throughput into a plain topic vs topics with on.parse.error=reject and with coerce.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import confluent_kafka as ck
import requests
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support
from icelog.meta.sqlite import SqliteStore  # noqa: E402
from icelog.schema.enforce.enforcement import Enforcer, LocalSchemaSource  # noqa: E402
from icelog.schema.protobuf_schema import compile_schema, message_descriptor  # noqa: E402
from icelog.schema.registry.service import RegistryService  # noqa: E402
from icelog.topics import side_config  # noqa: E402
from tests.support.broker import BrokerProcess  # noqa: E402

PROTO = """syntax = "proto3";
package bench;
message Event { string id = 1; int64 at = 2; string page = 3; repeated string tags = 4; }
"""


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_us": round(statistics.median(ordered) * 1e6, 1),
        "p99_us": round(ordered[int(len(ordered) * 0.99) - 1] * 1e6, 1),
    }


def timed(call: Callable[[], object], count: int) -> dict[str, float]:
    for _ in range(min(200, count)):
        call()  # warm-up: caches on both sides, connection pool
    samples = []
    for _ in range(count):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return percentiles(samples)


def produce_rate(bootstrap: str, topic: str, values: list[bytes]) -> float:
    producer = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all",
                            "compression.type": "lz4"})
    start = time.perf_counter()
    for value in values:
        while True:
            try:
                producer.produce(topic, value=value)
                break
            except BufferError:
                producer.poll(0.01)
    assert producer.flush(60) == 0
    return len(values) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lookups", type=int, default=2000)
    parser.add_argument("--records", type=int, default=100000)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "registry_bench.json",
                        help="where the results go as JSON (none: not written)")
    args = parser.parse_args()
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        broker = BrokerProcess(Path(tmp) / "data").start()
        try:
            url = broker.registry_url
            client = SchemaRegistryClient({"url": url})
            schema_id = client.register_schema("events-value", Schema(PROTO, "PROTOBUF"))
            session = requests.Session()

            def get(path: str, **params: str) -> None:
                response = session.get(url + path, params=params)
                assert response.status_code == 200, response.text

            results["http_schema_by_id"] = timed(lambda: get(f"/schemas/ids/{schema_id}"), args.lookups)
            results["http_schema_by_id_serialized"] = timed(
                lambda: get(f"/schemas/ids/{schema_id}", format="serialized"), args.lookups)
            results["http_latest_version"] = timed(lambda: get("/subjects/events-value/versions/latest"), args.lookups)
            results["client_cache_get_schema"] = timed(lambda: client.get_schema(schema_id), args.lookups)

            # Broker side: what enforcement does per record, with its caches warm (same code, in process).
            store = SqliteStore(Path(tmp) / "data" / "meta.db")
            enforcer = Enforcer(LocalSchemaSource(RegistryService(store)), 5000)
            side = side_config("events", "value", {"icelog.schema.value.on.parse.error": "reject"})
            message = message_descriptor(compile_schema(PROTO, {}), None)
            from google.protobuf import message_factory

            payload = message_factory.GetMessageClass(message)(id="e", at=1, page="/p").SerializeToString()

            async def enforce_lookups() -> dict[str, float]:
                await enforcer._check(side, payload, await enforcer._latest_id("events-value"))
                samples = []
                for _ in range(args.lookups * 10):
                    start = time.perf_counter()
                    await enforcer._check(side, payload, await enforcer._latest_id("events-value"))
                    samples.append(time.perf_counter() - start)
                return percentiles(samples)

            results["broker_enforcement_lookup_and_parse"] = asyncio.run(enforce_lookups())
            store.close()

            admin = AdminClient({"bootstrap.servers": broker.bootstrap})
            topics = {
                "plain": {},
                "reject": {"icelog.schema.value": "subject:events-value",
                           "icelog.schema.value.on.parse.error": "reject"},
                "coerce": {"icelog.schema.value": "subject:events-value", "icelog.schema.value.coerce": "true"},
            }
            for name, configs in topics.items():
                admin.create_topics([NewTopic(f"bench-{name}", 1, 1, config=configs)])[f"bench-{name}"].result(10)
            values = [message_factory.GetMessageClass(message)(id=str(i), at=i, page="/p" * 20).SerializeToString()
                      for i in range(args.records)]
            rates: dict[str, list[float]] = {name: [] for name in topics}
            for _ in range(2):  # alternate, so machine noise hits every mode alike
                for name in topics:
                    rates[name].append(produce_rate(broker.bootstrap, f"bench-{name}", values))
            results["produce_records_per_s"] = {name: round(max(r)) for name, r in rates.items()}
        finally:
            broker.stop()
    print(json.dumps(results, indent=2))
    if str(args.out) != "none":
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
