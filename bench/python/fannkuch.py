# List slicing and reversal: the pancake-flipping permutations of 8 items.
def fannkuch(n):
    perm1 = list(range(n))
    count = list(range(1, n + 1))
    maxflips = checksum = 0
    sign, r = 1, n
    while True:
        perm = perm1[:]
        flips = 0
        k = perm[0]
        while k:
            perm[:k + 1] = perm[k::-1]
            flips += 1
            k = perm[0]
        maxflips = max(maxflips, flips)
        checksum += flips * sign
        while r != 1:
            count[r - 1] = r
            r -= 1
        while True:
            if r == n:
                return checksum, maxflips
            p0 = perm1[0]
            perm1[:r] = perm1[1:r + 1]
            perm1[r] = p0
            count[r] -= 1
            if count[r] > 0:
                break
            r += 1
        sign = -sign
        r = r if r > 1 else 1


def bench():
    fannkuch(8)
