# The native backend: Debian's CPython with its scientific stack, in a hardened
# process that sees only its workspace (run with --backend native).
import numpy as np
import pandas as pd
import matplotlib.pyplot as plt

sales = pd.DataFrame({"region": ["north", "south", "north", "east", "south", "east"],
                      "units": [12, 7, 30, 5, 18, 9]})
print(sales.groupby("region")["units"].sum().sort_values(ascending=False).to_string())
print("mean of a million normal draws:", round(float(np.random.default_rng(0).normal(size=1_000_000).mean()), 4))

sales.groupby("region")["units"].sum().plot.bar(title="units by region")
plt.tight_layout()  # the figure open at the end is returned as a display (displays/*.png)

try:
    import socket
    socket.create_connection(("1.1.1.1", 53), timeout=2)
    print("UNEXPECTED: reached the network")
except OSError as e:
    print("the network is refused:", type(e).__name__)
