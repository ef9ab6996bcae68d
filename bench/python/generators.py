# Generator pipelines, comprehensions and unpacking.
def numbers(n):
    for i in range(n):
        yield i


def pairs(it):
    it = iter(it)
    for a in it:
        yield a, next(it, 0)


def bench():
    for _ in range(8):
        total = 0
        for a, b in pairs(x * 3 for x in numbers(20000) if x % 3):
            total += a - b
        sum(v for _, v in enumerate(range(20000)))
        [(x, y) for x, y in zip(range(10000), reversed(range(10000)))]
