# Function calls: positional, keyword, defaults, *args, closures, lambdas.
def f(a, b, c=3, *, d=4):
    return a + b + c + d


def g(*args, **kwargs):
    return len(args) + len(kwargs)


def adder(n):
    return lambda x: x + n


def bench():
    add = adder(2)
    total = 0
    for i in range(25000):
        total += f(i, 1) + f(i, 2, d=1) + g(i, i, k=i) + add(i)
