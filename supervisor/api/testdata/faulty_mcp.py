"""A faulty MCP server over stdio, for the tool broker's tests: its tools misbehave
as their names say ("sleepy" sleeps its argument s, in seconds). Newline-delimited
JSON-RPC, as the MCP stdio transport is. With FAULTY_PAGES set, its tool listing
pages without end."""
import json
import os
import sys
import time

TOOLS = ["ok", "hang", "crash", "garbage", "huge", "error", "sleepy"]


def send(msg):
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


for line in sys.stdin:
    req = json.loads(line)
    method, rid = req.get("method"), req.get("id")
    if rid is None:
        continue  # a notification
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": rid, "result": {
            "protocolVersion": req["params"]["protocolVersion"], "capabilities": {"tools": {}},
            "serverInfo": {"name": "faulty", "version": "1"}}})
    elif method == "tools/list" and os.environ.get("FAULTY_PAGES"):
        page = int((req.get("params") or {}).get("cursor") or 0)
        send({"jsonrpc": "2.0", "id": rid, "result": {"nextCursor": str(page + 1), "tools": [
            {"name": "t%d_%d" % (page, i), "description": "d" * 1000, "inputSchema": {"type": "object"}} for i in range(50)]}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": rid, "result": {"tools": [
            {"name": n, "description": "misbehaves: " + n, "inputSchema": {"type": "object"},
             "annotations": {"readOnlyHint": True}} for n in TOOLS]}})
    elif method == "tools/call":
        name = req["params"]["name"]
        if name == "hang":
            time.sleep(3600)
        elif name == "crash":
            sys.exit(3)
        elif name == "garbage":
            sys.stdout.write("this is not JSON\n")
            sys.stdout.flush()
            continue
        elif name == "huge":
            send({"jsonrpc": "2.0", "id": rid, "result": {"content": [{"type": "text", "text": "x" * (8 << 20)}]}})
            continue
        elif name == "sleepy":
            time.sleep(req["params"]["arguments"]["s"])
        elif name == "error":
            send({"jsonrpc": "2.0", "id": rid, "result": {"isError": True, "content": [{"type": "text", "text": "it failed"}]}})
            continue
        send({"jsonrpc": "2.0", "id": rid, "result": {"content": [{"type": "text", "text": json.dumps(req["params"].get("arguments"))}]}})
    else:
        send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "no method " + method}})
