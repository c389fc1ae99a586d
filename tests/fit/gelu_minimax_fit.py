#!/usr/bin/env python3
# tests/fit/gelu_minimax_fit.py: the offline fit behind gemc's gelu_taylor (docs/activations.md).
# Not run by `make test`: it printed the coefficients that runtime/cpu/numerics.c,
# kernels/prelude.cuh, kernels/attention.cuh and tests/codegen/prelude_on_cpu.h carry, and
# test_numerics measures what they compute. Python 3 standard library only (math.erf).
#
#   gelu_taylor(x) = x                      for x >= C
#                  = 0                      for x <= -C
#                  = x/2 + x^2 p(x^2)       otherwise, p of degree N - 1 (q(t) = t p(t))
#
# GELU(x) - x/2 = (x/2) erf(x/sqrt 2) is even, so the polynomial is in t = x^2; q(0) = 0 keeps
# gelu(0) = 0 and gelu'(0) = 1/2 exact. q is constrained to q(C^2) = C/2, so the function is
# continuous at the clamp: q(t) = t/(2C) + t (t - C^2) s(t), s in a Chebyshev basis on
# [0, C^2]. The free coefficients minimise max over x in (0, C) of max(|e(x)|, LAM |e'(x)|),
# e = the error against exact GELU, by Lawson's iteratively reweighted least squares on a grid
# (a linear minimax problem over value and derivative rows at once). The coefficients are then
# rounded to fp32, each within two ulps, chosen so q(C^2) stays within ~1e-10 of C/2: the fp32
# kernels and the double CPU executor evaluate one polynomial with the same coefficients.
#
#   python3 tests/fit/gelu_minimax_fit.py [C N LAM]     (defaults: 4.125 8 0.2)
import itertools
import math
import struct
import sys
from fractions import Fraction

SQ2 = math.sqrt(2.0)
ISQ2PI = 1.0 / math.sqrt(2.0 * math.pi)


def g(x):  # GELU(x) - x/2
    return 0.5 * x * math.erf(x / SQ2)


def gp(x):  # d/dx of g
    return 0.5 * math.erf(x / SQ2) + x * ISQ2PI * math.exp(-0.5 * x * x)


def f32(v):
    return struct.unpack("f", struct.pack("f", v))[0]


def cheb(u, m):  # T_0..T_{m-1}(u) and dT/du
    T, D = [1.0, u], [0.0, 1.0]
    for _ in range(2, m):
        T.append(2 * u * T[-1] - T[-2])
        D.append(2 * T[-2] + 2 * u * D[-1] - D[-2])
    return T[:m], D[:m]


def solve(A, b):  # Gaussian elimination with partial pivoting
    n = len(A)
    M = [row[:] + [b[i]] for i, row in enumerate(A)]
    for i in range(n):
        p = max(range(i, n), key=lambda r: abs(M[r][i]))
        M[i], M[p] = M[p], M[i]
        for r in range(i + 1, n):
            f = M[r][i] / M[i][i]
            for k in range(i, n + 1):
                M[r][k] -= f * M[i][k]
    x = [0.0] * n
    for i in reversed(range(n)):
        x[i] = (M[i][n] - sum(M[i][k] * x[k] for k in range(i + 1, n))) / M[i][i]
    return x


def fit(C, N, lam, points=600, iters=1500):
    C2, m = C * C, N - 1
    rows, rhs = [], []
    for i in range(1, points):
        x = C * math.sin(math.pi / 2 * i / points)  # denser towards C
        t = x * x
        T, D = cheb(2 * t / C2 - 1, m)
        w, dw = t * (t - C2), 2 * t - C2
        rows.append([w * T[k] for k in range(m)])
        rhs.append(g(x) - t / (2 * C))
        rows.append([lam * 2 * x * (dw * T[k] + w * D[k] * 2 / C2) for k in range(m)])
        rhs.append(lam * (gp(x) - x / C))
    R = len(rows)
    wts = [1.0 / R] * R
    best = None
    for _ in range(iters):
        A = [[0.0] * m for _ in range(m)]
        b = [0.0] * m
        for r in range(R):
            row, wr = rows[r], wts[r]
            for i in range(m):
                f = wr * row[i]
                b[i] += f * rhs[r]
                for k in range(i, m):
                    A[i][k] += f * row[k]
        for i in range(m):
            for k in range(i):
                A[i][k] = A[k][i]
        a = solve(A, b)
        res = [abs(sum(rows[r][k] * a[k] for k in range(m)) - rhs[r]) for r in range(R)]
        if best is None or max(res) < best[0]:
            best = (max(res), a)
        s = sum(wts[r] * res[r] for r in range(R))
        wts = [wts[r] * res[r] / s for r in range(R)]
    return best[1]


def to_monomial(C, N, a):  # q(t) = sum_{k=1..N} q_k t^k
    C2, m = C * C, N - 1
    Tm = [[1.0], [0.0, 1.0]]
    for _ in range(2, m):
        p = [0.0] + [2 * v for v in Tm[-1]]
        for i, v in enumerate(Tm[-2]):
            p[i] -= v
        Tm.append(p)
    su = [0.0] * m  # s in u = 2t/C^2 - 1
    for k in range(m):
        for i, v in enumerate(Tm[k]):
            su[i] += a[k] * v
    st = [0.0] * m  # s in t
    for i, v in enumerate(su):
        for j in range(i + 1):
            st[j] += v * math.comb(i, j) * (2 / C2) ** j * (-1.0) ** (i - j)
    q = [0.0] * (N + 1)
    q[1] += 1 / (2 * C)
    for j, v in enumerate(st):
        q[j + 2] += v
        q[j + 1] -= C2 * v
    return q[1:]


def f32_ulp(v):  # the gap above |v| in fp32
    b = struct.unpack("I", struct.pack("f", abs(v)))[0]
    return struct.unpack("f", struct.pack("I", b + 1))[0] - abs(v)


def round_f32(C, q, reach=2):
    """q rounded to fp32, then each coefficient moved by up to `reach` ulps (meet in the
    middle over the 5^N choices, in exact rationals) so that q(C^2) is closest to C/2: the
    jump at the clamp shrinks from ~1e-7 to ~1e-10, far below fp32's ulp at C."""
    q = [f32(v) for v in q]
    C2 = Fraction(C) ** 2
    steps = range(-reach, reach + 1)
    opts = [[(d, (Fraction(v) + d * Fraction(f32_ulp(v))) * C2 ** (k + 1)) for d in steps]
            for k, v in enumerate(q)]
    h = len(q) // 2
    right = [(sum(o[1] for o in r), tuple(o[0] for o in r))
             for r in itertools.product(*opts[h:])]
    target, best = Fraction(C) / 2, None
    for l in itertools.product(*opts[:h]):
        sl = sum(o[1] for o in l)
        for sr, dr in right:
            j = abs(sl + sr - target)
            if best is None or j < best[0]:
                best = (j, tuple(o[0] for o in l) + dr)
    return [v + d * f32_ulp(v) for v, d in zip(q, best[1])]


def gelu_minimax(q, C, x):
    if x >= C:
        return x, 1.0
    if x <= -C:
        return 0.0, 0.0
    t = x * x
    p = 0.0
    for a in reversed(q):
        p = p * t + a
    dp = 0.0
    for k in range(len(q), 0, -1):
        dp = dp * t + k * q[k - 1]
    return 0.5 * x + t * p, 0.5 + 2 * x * dp


def main():
    C, N, lam = 4.125, 8, 0.2
    if len(sys.argv) == 4:
        C, N, lam = float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    q = round_f32(C, to_monomial(C, N, fit(C, N, lam)))
    worst_v = worst_d = 0.0
    S = 200000
    for i in range(-S, S + 1):
        x = 10.0 * i / S
        v, d = gelu_minimax(q, C, x)
        ev = 0.5 * x * (1 + math.erf(x / SQ2))
        ed = 0.5 * (1 + math.erf(x / SQ2)) + x * ISQ2PI * math.exp(-0.5 * x * x)
        worst_v = max(worst_v, abs(v - ev))
        worst_d = max(worst_d, abs(d - ed))
    print("C = %r, N = %d, LAM = %r" % (C, N, lam))
    for k, v in enumerate(q):
        print("  a%d = %.9ef  (%s)" % (k + 1, v, float.hex(v)))
    print("max |error| on [-10, 10]: value %.4e, derivative %.4e" % (worst_v, worst_d))
    print("jump at the clamp: %.3e" % abs(gelu_minimax(q, C, math.nextafter(C, 0))[0] - C))


if __name__ == "__main__":
    main()
