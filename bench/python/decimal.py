# decimal.Decimal arithmetic at 28 digits, quantized as money.
from decimal import Decimal, ROUND_HALF_EVEN

PRICES = [Decimal("%d.%02d" % (i, i % 100)) for i in range(1, 2001)]
RATE = Decimal("0.0725")
CENT = Decimal("0.01")


def bench():
    for _ in range(5):
        total = Decimal(0)
        for p in PRICES:
            total += (p * (1 + RATE)).quantize(CENT, rounding=ROUND_HALF_EVEN)
        (total / 3).sqrt()
