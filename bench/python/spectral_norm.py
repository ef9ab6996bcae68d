# Nested loops of float arithmetic over lists: the spectral norm of a 120x120 matrix.
def a(i, j):
    return 1.0 / ((i + j) * (i + j + 1) // 2 + i + 1)


def mul_av(v):
    n = len(v)
    return [sum(a(i, j) * v[j] for j in range(n)) for i in range(n)]


def mul_atv(v):
    n = len(v)
    return [sum(a(j, i) * v[j] for j in range(n)) for i in range(n)]


def bench():
    u = [1.0] * 120
    for _ in range(4):
        v = mul_atv(mul_av(u))
        u = mul_atv(mul_av(v))
