"""What a Metadata answer naming a probe's topics costs it through kafka-python (issue 49).

An HA probe that does not hold shard 0 names its own topics in its Metadata requests, through
kafka-python (``monitor.named_metadata``); naming them through librdkafka (DescribeTopics) cost
more CPU than the whole listing (bench/README.md). This measures, in this process, a Metadata
answer (version 12) of ``--topics`` topics of ``--partitions`` partitions, 3 replicas each,
encoded by kafka-python itself (librdkafka's mock cluster, the probe benches' cluster, cannot
be read by kafka-python 3.0: it does not decode the mock's answer to ApiVersions v4). CPU-s:

- to decode it, and to decode it into dicts (``to_dict``, which the probe does not use);
- what the probe does at a refresh: decode and build its view (``ClusterView.from_metadata_response``),
  the first time, and again over that view with nothing changed (the steady state).

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
    sys.path.insert(0, str(ROOT))
    from monitor.cluster_view import ClusterView

    names = [f"bench-{t}" for t in range(args.topics)]
    first = cpu_s(lambda: ClusterView.from_metadata_response(MetadataResponse.decode(data, version=VERSION), names,
                                                             None), args.runs)
    prev = ClusterView.from_metadata_response(MetadataResponse.decode(data, version=VERSION), names, None)
    steady = cpu_s(lambda: ClusterView.from_metadata_response(MetadataResponse.decode(data, version=VERSION), names,
                                                              prev), args.runs)
    n = args.topics * args.partitions
    print(f"{n:,} partitions, {len(data):,} bytes: decode {statistics.median(decode):.3f} CPU-s, "
          f"decode + to_dict {statistics.median(to_dict):.3f} CPU-s; the probe's refresh (decode + view): "
          f"first {statistics.median(first):.3f}, unchanged {statistics.median(steady):.3f} CPU-s "
          f"(medians of {args.runs})")
    import kafka
    report.write(args.out, "metadata-decode", args=vars(args), kafka_python=getattr(kafka, "__version__", "?"),
                 partitions=n, bytes=len(data), decode_cpu_s=statistics.median(decode),
                 decode_to_dict_cpu_s=statistics.median(to_dict),
                 decode_view_first_cpu_s=statistics.median(first), decode_view_unchanged_cpu_s=statistics.median(steady),
                 runs_decode=[round(x, 4) for x in decode], runs_to_dict=[round(x, 4) for x in to_dict],
                 runs_view_first=[round(x, 4) for x in first], runs_view_unchanged=[round(x, 4) for x in steady])
    return 0


if __name__ == "__main__":
    sys.exit(main())
