# A short tour of the sandbox: this runs inside python.wasm in a hardened worker.
import os
import platform
import socket
import sys

print("Python", sys.version.split()[0], "on", platform.machine() or sys.platform)
print("sum of squares below 1e6:", sum(i * i for i in range(1_000_000)))

with open("/ws/hello.txt", "w") as f:
    f.write("written from inside the sandbox\n")
print("wrote /ws/hello.txt; the workspace holds", os.listdir("/ws"))
print("working directory:", os.getcwd(), "| environment:", dict(os.environ))

try:
    open("/etc/hostname").read()
    print("UNEXPECTED: read /etc/hostname")
except OSError as e:
    print("reading /etc/hostname is refused:", type(e).__name__)

try:
    socket.socket(socket.AF_INET, socket.SOCK_STREAM).connect(("127.0.0.1", 80))
    print("UNEXPECTED: opened a network connection")
except Exception as e:
    print("opening a network socket is refused:", type(e).__name__, e)
