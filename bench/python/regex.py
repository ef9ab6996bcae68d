# re: search, findall, sub and split of compiled patterns over a log-like text.
import re

TEXT = "\n".join("2024-05-%02d 12:%02d:%02d host%d GET /api/v1/items/%d?q=%s 200 %d ms user@example.org"
                 % (1 + i % 28, i % 60, (i * 7) % 60, i % 5, i, "abc" * (i % 4), i * 3) for i in range(400))
PATTERNS = [re.compile(p) for p in (
    r"(\d{4})-(\d{2})-(\d{2})", r"GET (/\S+)", r"[\w.]+@[\w.]+", r"host(\d+)", r"\b(\d+) ms\b",
    r"q=(abc)+", r"^2024-05-1\d.*$")]


def bench():
    for _ in range(3):
        for p in PATTERNS:
            p.findall(TEXT)
            p.search(TEXT)
        re.sub(r"\d+", "#", TEXT)
        re.split(r"\s+", TEXT)
