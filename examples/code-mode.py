"""Code mode: join a workspace CSV with an internal tool's data, in one program.

The daemon's operator declares the tool (here the reference MCP memory server, as
[tools.memory]; see docs/agents.md). The program reads orders from the workspace,
records each customer in the tool's knowledge graph (a write: one approval, granted
for the whole loop), reads the graph back, and joins it with the orders. Every call
is checked, approved where it writes, and audited by the daemon; the program itself
has no network.
"""
import csv
import io

from sandcell.tools import memory, ToolError

ORDERS = """order,customer,amount
1001,acme,120.50
1002,globex,75.00
1003,acme,30.25
1004,initech,410.00
"""
try:
    orders = list(csv.DictReader(open("orders.csv")))
except FileNotFoundError:  # the example's own data, when the workspace has none
    orders = list(csv.DictReader(io.StringIO(ORDERS)))

customers = sorted({o["customer"] for o in orders})
for name in customers:
    total = sum(float(o["amount"]) for o in orders if o["customer"] == name)
    memory.create_entities(entities=[{"name": name, "entityType": "customer",
                                      "observations": ["ordered %.2f in all" % total]}])

graph = memory.read_graph()
known = {e["name"]: e["observations"] for e in graph["entities"] if e.get("entityType") == "customer"}
for o in orders:
    print(o["order"], o["customer"], o["amount"], "|", "; ".join(known.get(o["customer"], ["(not in the graph)"])))
try:
    memory.delete_entities(entityNames=customers)  # a write the approver may decline
except ToolError as e:
    print("cleanup not done:", type(e).__name__)
