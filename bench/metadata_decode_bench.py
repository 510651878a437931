"""What a Metadata answer naming a probe's topics would cost it through kafka-python (issue 49).

An HA probe reads the whole cluster's metadata through librdkafka; naming its own topics through
librdkafka (DescribeTopics) cost more CPU than the whole listing (bench/README.md). This measures
the other client the probe has: kafka-python 3.x decoding a Metadata answer (version 12) of
``--topics`` topics of ``--partitions`` partitions, 3 replicas each, encoded by kafka-python
itself, in this process: CPU-s to decode, and to decode and turn it into dicts (``to_dict``).

    python bench/metadata_decode_bench.py            # 250 topics of 100: a quarter of 100,000 partitions

Prints its figures and writes bench/results/metadata-decode.json.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time
import uuid

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import report  # noqa: E402

VERSION = 12


def answer(topics: int, partitions: int) -> bytes:
    from kafka.protocol.metadata import MetadataResponse as R

    part = R.MetadataResponseTopic.MetadataResponsePartition
    return R(throttle_time_ms=0, cluster_id="bench", controller_id=1,
             brokers=[R.MetadataResponseBroker(node_id=i, host="127.0.0.1", port=9090 + i, rack=None) for i in (1, 2, 3)],
             topics=[R.MetadataResponseTopic(
                 error_code=0, name=f"bench-{t}", topic_id=uuid.uuid4(), is_internal=False,
                 partitions=[part(error_code=0, partition_index=p, leader_id=p % 3 + 1, leader_epoch=3,
                                  replica_nodes=[1, 2, 3], isr_nodes=[1, 2, 3], offline_replicas=[])
                             for p in range(partitions)]) for t in range(topics)]).encode(version=VERSION)


def cpu_s(f, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        c = time.process_time()
        f()
        out.append(time.process_time() - c)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--topics", type=int, default=250)
    ap.add_argument("--partitions", type=int, default=100, help="per topic (default: %(default)s)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "metadata-decode.json"))
    args = ap.parse_args()
    from kafka.protocol.metadata import MetadataResponse

    data = answer(args.topics, args.partitions)
    decode = cpu_s(lambda: MetadataResponse.decode(data, version=VERSION), args.runs)
    to_dict = cpu_s(lambda: MetadataResponse.decode(data, version=VERSION).to_dict(), args.runs)
    n = args.topics * args.partitions
    print(f"{n:,} partitions, {len(data):,} bytes: decode {statistics.median(decode):.3f} CPU-s, "
          f"decode + to_dict {statistics.median(to_dict):.3f} CPU-s (medians of {args.runs})")
    import kafka
    report.write(args.out, "metadata-decode", args=vars(args), kafka_python=getattr(kafka, "__version__", "?"),
                 partitions=n, bytes=len(data), decode_cpu_s=statistics.median(decode),
                 decode_to_dict_cpu_s=statistics.median(to_dict),
                 runs_decode=[round(x, 4) for x in decode], runs_to_dict=[round(x, 4) for x in to_dict])
    return 0


if __name__ == "__main__":
    sys.exit(main())
