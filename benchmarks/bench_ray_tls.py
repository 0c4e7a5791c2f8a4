"""Cost of Ray's TLS per hand-off round on loopback (docs/security.md, issue 21).

The DSGLD hand-off of ``bench_ray.py`` (logistic regression, d = 10, 200 rows per client,
local_steps = 20, 4 chains in flight) run by ``fm.sample(..., engine="ray")`` on the local
instance it starts (token authentication, per-instance token), once with Ray's gRPC in
plain text and once with TLS: ``RAY_USE_TLS=1``, ``RAY_TLS_SERVER_CERT``,
``RAY_TLS_SERVER_KEY`` and ``RAY_TLS_CA_CERT`` set to a self-signed certificate for
127.0.0.1 made here with ``openssl`` (every Ray process, the driver included, then speaks
TLS with mutual certificate checks). Each configuration runs in a fresh process (Ray reads
the variables when its processes start), alternating plain/TLS ``--repeats`` times so that
both see the same load on a shared machine. Per round = ``info["wall_time"]`` / visits
(set-up excluded, as in ``bench_ray.py``).

    python benchmarks/bench_ray_tls.py                  # 4 clients, 100 rounds per chain, 2 repeats
    python benchmarks/bench_ray_tls.py --rounds 50 --repeats 1
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def make_certificate(directory: str) -> dict:
    """A self-signed certificate and key for 127.0.0.1 (and localhost); the TLS variables."""
    cert, key = os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-sha256", "-days", "2", "-nodes",
         "-keyout", key, "-out", cert, "-subj", "/CN=ray-loopback",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True, capture_output=True, timeout=60)
    os.chmod(key, 0o600)
    return {"RAY_USE_TLS": "1", "RAY_TLS_SERVER_CERT": cert, "RAY_TLS_SERVER_KEY": key,
            "RAY_TLS_CA_CERT": cert}


def child(clients: int, rounds: int) -> None:
    """One fm.sample run on Ray in this process; prints a JSON line of its figures."""
    sys.path.insert(0, HERE)
    import bench_ray
    import fedmcmc as fm

    model, federation = bench_ray.make_problem(clients)
    algorithm = fm.DSGLD(step_size=bench_ray.STEP, batch_size=10,
                         local_steps=bench_ray.LOCAL_STEPS)
    per_round, setup, info = bench_ray.protocol_round_seconds(
        model, federation, algorithm, 4, rounds, "ray")
    print(json.dumps({
        "ms_per_round": per_round * 1e3, "setup_s": setup,
        "bytes_per_round": (info["bytes_to_clients"] + info["bytes_from_clients"])
        / sum(info["rounds_per_chain"]),
        "ray_authentication": info.get("ray_authentication"),
        "tls": os.environ.get("RAY_USE_TLS") == "1",
        "direct_channels": info.get("ray_direct_channels", 0),
        "channel_failures": info.get("ray_channel_failures", []),
    }), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=100, help="rounds per chain")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.clients, args.rounds)
        return
    if shutil.which("openssl") is None:
        raise SystemExit("needs the openssl command to make a self-signed certificate")
    directory = tempfile.mkdtemp(prefix="fedmcmc-bench-tls-")
    tls = make_certificate(directory)
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_TLS_")
            and k != "RAY_USE_TLS"}
    base["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    rows = {"plain": [], "tls": []}
    try:
        print(f"load average at start: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
        print(f"DSGLD hand-off on Ray, {args.clients} clients, 4 chains, {args.rounds} rounds "
              "per chain, token authentication in both")
        print(f"{'config':>6} {'ms/round':>9} {'setup s':>8} {'B/round':>8} {'auth':>6} "
              f"{'channels':>8}")
        for _ in range(args.repeats):
            for name, extra in (("plain", {}), ("tls", tls)):
                out = subprocess.run(
                    [sys.executable, os.path.abspath(__file__), "--child",
                     "--clients", str(args.clients), "--rounds", str(args.rounds)],
                    env={**base, **extra}, capture_output=True, text=True, timeout=1800)
                lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
                if out.returncode != 0 or not lines:
                    raise SystemExit(f"{name} run failed:\n{out.stdout}\n{out.stderr[-3000:]}")
                row = json.loads(lines[-1])
                if row["tls"] != (name == "tls"):
                    raise SystemExit(f"{name} run did not see the intended RAY_USE_TLS")
                rows[name].append(row)
                print(f"{name:>6} {row['ms_per_round']:>9.2f} {row['setup_s']:>8.1f} "
                      f"{row['bytes_per_round']:>8.0f} {row['ray_authentication']:>6} "
                      f"{row['direct_channels']:>8}", flush=True)
                if row["channel_failures"]:
                    print(f"       channel failures: {row['channel_failures']}", flush=True)
        plain = statistics.median(r["ms_per_round"] for r in rows["plain"])
        with_tls = statistics.median(r["ms_per_round"] for r in rows["tls"])
        print(f"median ms/round: plain {plain:.2f}, TLS {with_tls:.2f}, "
              f"TLS - plain {with_tls - plain:+.2f} ms ({with_tls / plain:.2f}x)")
        print(f"load average at end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
