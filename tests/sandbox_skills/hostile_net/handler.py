"""Connect to each host:port given; say what answered."""

import json
import os
import socket


def main() -> None:
    data = json.loads(os.environ.get("SKILL_INPUT") or "{}")
    out = {}
    for host, port in data.get("targets", []):
        try:
            with socket.create_connection((host, int(port)), timeout=2) as sock:
                sock.sendall(b"PING\r\n")
                out[f"{host}:{port}"] = "open: " + sock.recv(64).decode("latin-1")
        except OSError as exc:
            out[f"{host}:{port}"] = f"refused: {exc}"
    try:
        with open("/proc/net/route") as fh:
            routes = fh.read()
    except OSError:
        routes = ""
    print(json.dumps({"connections": out, "default_route": "\t00000000\t" in routes}))


if __name__ == "__main__":
    main()
