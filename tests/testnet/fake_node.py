"""A stand-in *process* for the supervisor's tests (not for the node's logic): it binds the two ports of
docs/node-contract.md, prints the LISTENING line, answers `GET /status` with counters that grow with
time and records `POST /chaos` bodies to `<checkpoint-dir>/chaos.jsonl`.

Test knobs: `--ignore-term` (survive SIGTERM, so only SIGKILL stops it), `--grandchild` (start a
sleeping child in the same process group and write its pid to `<checkpoint-dir>/grandchild.pid`),
`--die-before-listening` (print an error to stderr and exit 3), `--exit-after-listening CODE` (print
LISTENING, then an error to stderr, and exit CODE at once, as a node with a bad --data source does),
`--finish-after S` (print a STOPPED line and exit 0 after S seconds, as a node does after --max-rounds),
`--tokens-per-step N` (the tokens its counters report per step, 100 by default), `--steps-per-second R`
(its pace, 10 by default), `--train-after S` (state "syncing" for S seconds after its start, then
"training", as a node compiling its steps).
"""

import argparse
import ssl
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time



def tls_context(pem: str) -> ssl.SSLContext:
    """A server context with the libp2p certificate in `pem` (the harness made it: `testnet_helpers.fake_pem`)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.load_cert_chain(pem)
    return context


def split(addr):
    host, _, port = addr.rpartition(":")
    return host, int(port)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--listen", required=True)
    p.add_argument("--http", required=True)
    p.add_argument("--tls-pem", required=True, help="certificate and key (PEM) of its https plane")
    p.add_argument("--peer-id", required=True)
    p.add_argument("--checkpoint-dir", required=True)
    p.add_argument("--peers", default="")
    p.add_argument("--ignore-term", action="store_true")
    p.add_argument("--grandchild", action="store_true")
    p.add_argument("--die-before-listening", action="store_true")
    p.add_argument("--exit-after-listening", type=int, default=None, metavar="CODE")
    p.add_argument("--finish-after", type=float, default=None, help="print STOPPED and exit 0 after this long")
    p.add_argument("--tokens-per-step", type=int, default=100, help="tokens each of its steps counts")
    p.add_argument("--steps-per-second", type=float, default=10.0, help="its pace")
    p.add_argument("--train-after", type=float, default=0.0, help="report state syncing for this long first")
    p.add_argument("--publish-on-stop", type=float, default=None, metavar="SECONDS",
                   help="on SIGTERM, count 1 s more of contributed steps (a round the stop cut short, "
                        "published), write the last status to CHECKPOINT_DIR/status.json and go on answering "
                        "/status for SECONDS before exiting 0")
    args = p.parse_args()
    started = time.time()
    if args.die_before_listening:
        print("fatal: cannot load the model (test)", file=sys.stderr, flush=True)
        sys.exit(3)
    stopped_at: list[float] = []

    def on_term(*_):
        if args.publish_on_stop is None:
            os._exit(0)
        if not stopped_at:
            stopped_at.append(time.time())
            with open(os.path.join(args.checkpoint_dir, "status.json"), "w") as f:
                json.dump(status(), f)
            threading.Timer(args.publish_on_stop, os._exit, (0,)).start()

    signal.signal(signal.SIGTERM, signal.SIG_IGN if args.ignore_term else on_term)
    if args.grandchild:
        child = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])
        with open(os.path.join(args.checkpoint_dir, "grandchild.pid"), "w") as f:
            f.write(str(child.pid))
    gossip = socket.socket()
    gossip.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    gossip.bind(split(args.listen))
    gossip.listen()
    chaos_log = os.path.join(args.checkpoint_dir, "chaos.jsonl")

    def status() -> dict:
        now = stopped_at[0] if stopped_at else time.time()
        published_at_stop = 1.0 if stopped_at else 0.0
        steps = int((now - started) * args.steps_per_second)
        state = "training" if now - started >= args.train_after else "syncing"
        return {"peer_id": args.peer_id, "state": state, "slot": steps // 5, "round": steps // 5,
                "inner_steps": steps, "tokens": steps * args.tokens_per_step, "loss": 3.0, "eval_loss": None,
                "eval_history": [], "peers": [x for x in args.peers.split(",") if x],
                "bytes_sent": steps * 1000, "bytes_received": steps * 1000, "updates_applied": steps // 5,
                "updates_rejected": {}, "ledger_digest": "aa", "params_digest": "bb",
                "steps_per_second": args.steps_per_second, "contributed_step_seconds": (now - started) * 0.9 + published_at_stop,
                "started_at": started, "first_update_at": started, "cpus": sorted(os.sched_getaffinity(0))}

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _json(self, obj):
            body = json.dumps(obj).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            self._json(status())

        def do_POST(self):
            body = self.rfile.read(int(self.headers["content-length"]))
            with open(chaos_log, "a") as f:
                f.write(json.dumps({"path": self.path, "body": json.loads(body)}) + "\n")
            self._json({"ok": True})

    server = http.server.ThreadingHTTPServer(split(args.http), Handler)
    server.socket = tls_context(args.tls_pem).wrap_socket(server.socket, server_side=True)  # https, as a node's plane is
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(f"LISTENING {args.peer_id} {args.listen.rpartition(':')[0]}:{gossip.getsockname()[1]} "
          f"{args.http.rpartition(':')[0]}:{server.server_address[1]}", flush=True)
    if args.exit_after_listening is not None:
        print(f"fatal: data source '/nonexistent' does not exist (test, {args.peer_id})", file=sys.stderr, flush=True)
        sys.exit(args.exit_after_listening)
    print("fake node running", file=sys.stderr, flush=True)
    if args.finish_after is not None:
        time.sleep(args.finish_after)
        print("STOPPED 7 aa bb", flush=True)
        sys.exit(0)
    while True:  # until the supervisor's signal ends the process. Not signal.pause(): the kernel may hand
        time.sleep(0.05)  # SIGTERM to a server thread, and then a paused main thread would never run the handler


if __name__ == "__main__":
    main()
