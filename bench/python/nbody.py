# Floating-point arithmetic: a few steps of five bodies under gravity.
import math

def make():
    return [[float(i), float(i * 2 % 5), float(i * 3 % 7), 0.1 * i, -0.2 * i, 0.05 * i, 1.0 + i]
            for i in range(5)]


def advance(bodies, dt, steps):
    pairs = [(a, b) for i, a in enumerate(bodies) for b in bodies[i + 1:]]
    for _ in range(steps):
        for a, b in pairs:
            dx, dy, dz = a[0] - b[0], a[1] - b[1], a[2] - b[2]
            d2 = dx * dx + dy * dy + dz * dz + 0.01
            mag = dt / (d2 * math.sqrt(d2))
            bm, am = b[6] * mag, a[6] * mag
            a[3] -= dx * bm; a[4] -= dy * bm; a[5] -= dz * bm
            b[3] += dx * am; b[4] += dy * am; b[5] += dz * am
        for body in bodies:
            body[0] += dt * body[3]; body[1] += dt * body[4]; body[2] += dt * body[5]


def bench():
    advance(make(), 0.01, 6000)
