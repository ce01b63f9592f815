"""CPU check of the tensor-core window kernels' fragment bookkeeping.

Mirrors kernels/fwd_tc_kernel.cuh and kernels/bwd_tc_kernel.cuh lane by
lane in NumPy -- the same staging (fp32's permuted NK rows), the same
per-lane loads of MmaTile (load_a, mma's B loads, acc_to_a, column), the
mma instructions as the PTX ISA lays out their fragments (m16n8k16 for fp16
/ bf16, m16n8k8 tf32 for fp32) -- and compares out, lse, dQ, dK, dV with a
dense float64 softmax attention over the window's multigraph. No GPU: this
checks the index algebra, not the compiled code.

    python scripts/tc_fragment_check.py
"""
import itertools

import numpy as np

LANES = 32


def lane_gq():
    lanes = np.arange(LANES)
    return lanes // 4, lanes % 4


# ------------------------------------------------------------ PTX layouts
def a_positions(k: int):
    """(row, col) of each A element a lane holds, in register order."""
    g, q = lane_gq()
    if k == 16:  # 4 regs x 2 halves
        pos = [(g, 2 * q), (g, 2 * q + 1), (g + 8, 2 * q), (g + 8, 2 * q + 1),
               (g, 2 * q + 8), (g, 2 * q + 9), (g + 8, 2 * q + 8),
               (g + 8, 2 * q + 9)]
    else:  # tf32: 4 regs
        pos = [(g, q), (g + 8, q), (g, q + 4), (g + 8, q + 4)]
    return pos


def b_positions(k: int):
    """(k, n) of each B element a lane holds, in register order."""
    g, q = lane_gq()
    if k == 16:
        return [(2 * q, g), (2 * q + 1, g), (2 * q + 8, g), (2 * q + 9, g)]
    return [(q, g), (q + 4, g)]


def c_positions():
    g, q = lane_gq()
    return [(g, 2 * q), (g, 2 * q + 1), (g + 8, 2 * q), (g + 8, 2 * q + 1)]


def mma(acc, a_vals, b_vals, k):
    """acc [32, 4] += A B, A / B assembled from the lanes' registers."""
    A = np.zeros((16, k))
    B = np.zeros((k, 8))
    for i, (r, c) in enumerate(a_positions(k)):
        A[r, c] = a_vals[:, i]
    for i, (r, c) in enumerate(b_positions(k)):
        B[r, c] = b_vals[:, i]
    D = A @ B
    for i, (r, c) in enumerate(c_positions()):
        acc[:, i] += D[r, c]


# ------------------------------------------------------------ MmaTile
class Tile:
    """MmaTile<T> (values kept in float64: rounding is not the question)."""

    def __init__(self, tf32: bool):
        self.tf32, self.k = tf32, (8 if tf32 else 16)

    def column(self, q, i):
        return q + 4 * (i & 1) if self.tf32 else 2 * q + (i & 1)

    def load_a(self, rows_a, rows_b, k0):
        """rows_a / rows_b: [32, DH] (zeros for invalid rows)."""
        g, q = lane_gq()
        L = np.arange(LANES)
        if self.tf32:
            return np.stack([rows_a[L, k0 + q], rows_b[L, k0 + q],
                             rows_a[L, k0 + q + 4], rows_b[L, k0 + q + 4]], 1)
        k = k0 + 2 * q
        return np.stack([rows_a[L, k], rows_a[L, k + 1], rows_b[L, k],
                         rows_b[L, k + 1], rows_a[L, k + 8],
                         rows_a[L, k + 9], rows_b[L, k + 8],
                         rows_b[L, k + 9]], 1)

    def acc_to_a(self, c0, c1):
        if self.tf32:
            return np.stack([c0[:, 0], c0[:, 2], c0[:, 1], c0[:, 3]], 1)
        return np.stack([c0[:, 0], c0[:, 1], c0[:, 2], c0[:, 3], c1[:, 0],
                         c1[:, 1], c1[:, 2], c1[:, 3]], 1)

    def mma(self, acc, a, nk_rows, k0):
        """nk_rows: [32, width], each lane's NK row (the kernel's
        `nk + (n0 + g) * stride`)."""
        g, q = lane_gq()
        L = np.arange(LANES)
        if self.tf32:
            b = np.stack([nk_rows[L, k0 + q], nk_rows[L, k0 + q + 4]], 1)
        else:
            k = k0 + 2 * q
            b = np.stack([nk_rows[L, k], nk_rows[L, k + 1], nk_rows[L, k + 8],
                          nk_rows[L, k + 9]], 1)
        mma(acc, a, b, self.k)


def staged_row(j):
    return (j & ~7) | ((j & 3) << 1) | ((j >> 2) & 1)


# ------------------------------------------------------------ the kernels
def forward(tile, Q, K, V, cnt, scale):
    """fwd_tc_kernel for one window and head: Q [rows, DH], K / V [n_src,
    DH], cnt [rows, n_src]. Returns out [rows, DH], lse [rows]."""
    rows, dh = Q.shape
    n_src = K.shape[0]
    g, q = lane_gq()
    tiles8 = (n_src + 7) // 8
    s_k = np.zeros((128, dh))
    s_vt = np.zeros((dh, 128))
    for j in range(n_src):
        s_k[staged_row(j) if tile.tf32 else j] = K[j]
        s_vt[:, j] = V[j]
    c = np.zeros((256, 128))
    c[:rows, :n_src] = cnt
    out = np.full((rows, dh), np.nan)
    lse = np.full(rows, np.nan)
    for r0 in range(0, rows, 16):
        ok_a, ok_b = r0 + g < rows, r0 + g + 8 < rows
        qa = np.where(ok_a[:, None], Q[np.minimum(r0 + g, rows - 1)], 0.)
        qb = np.where(ok_b[:, None], Q[np.minimum(r0 + g + 8, rows - 1)], 0.)
        s = np.zeros((16, LANES, 4))
        for k0 in range(0, dh, tile.k):
            fq = tile.load_a(qa, qb, k0)
            for t in range(16):
                if t < tiles8:
                    tile.mma(s[t], fq, s_k[t * 8 + g], k0)
        m_a = np.full(LANES, -np.inf)
        m_b = np.full(LANES, -np.inf)
        cnts = np.zeros((16, LANES, 4))
        for t in range(16):
            for i in range(4):
                ok = (t < tiles8) & (ok_a if i < 2 else ok_b)
                rr = r0 + g + (0 if i < 2 else 8)
                cc = c[np.minimum(rr, 255), t * 8 + tile.column(q, i)]
                cnts[t, :, i] = np.where(ok, cc, 0)
                s[t, :, i] = np.where(cnts[t, :, i] > 0, s[t, :, i] * scale,
                                      -np.inf)
            m_a = np.maximum(m_a, np.maximum(s[t, :, 0], s[t, :, 1]))
            m_b = np.maximum(m_b, np.maximum(s[t, :, 2], s[t, :, 3]))
        m_a = quad_reduce(m_a, np.maximum)
        m_b = quad_reduce(m_b, np.maximum)
        l_a, l_b = np.zeros(LANES), np.zeros(LANES)
        for t in range(16):
            for i in range(4):
                m = m_a if i < 2 else m_b
                with np.errstate(invalid='ignore'):
                    p = np.where(s[t, :, i] != -np.inf,
                                 cnts[t, :, i] * np.exp(s[t, :, i] - m), 0.)
                s[t, :, i] = p
            l_a += s[t, :, 0] + s[t, :, 1]
            l_b += s[t, :, 2] + s[t, :, 3]
        l_a, l_b = quad_reduce(l_a, np.add), quad_reduce(l_b, np.add)
        o = np.zeros((dh // 8, LANES, 4))
        for t in range(0, 16, tile.k // 8):
            if t < tiles8:
                fp = tile.acc_to_a(s[t], s[t if tile.tf32 else t + 1])
                for nt in range(dh // 8):
                    tile.mma(o[nt], fp, s_vt[nt * 8 + g], t * 8)
        for nt in range(dh // 8):
            f = nt * 8 + 2 * q
            for lanes_ok, rr, cols, l in ((ok_a, r0 + g, (0, 1), l_a),
                                          (ok_b, r0 + g + 8, (2, 3), l_b)):
                for lane in np.nonzero(lanes_ok)[0]:
                    out[rr[lane], f[lane]] = o[nt, lane, cols[0]] / (
                        l[lane] + 1e-16)
                    out[rr[lane], f[lane] + 1] = o[nt, lane, cols[1]] / (
                        l[lane] + 1e-16)
        for lane in range(0, LANES, 4):
            for ok, rr, m, l in ((ok_a, r0 + g, m_a, l_a),
                                 (ok_b, r0 + g + 8, m_b, l_b)):
                if ok[lane]:
                    lse[rr[lane]] = m[lane] + np.log(l[lane] + 1e-16) \
                        if m[lane] != -np.inf else -np.inf
    return out, lse


def quad_reduce(x, op):
    x = x.copy()
    for o in (1, 2):
        x = op(x, x[np.arange(LANES) ^ o])
    return x


def backward(tile, Q, K, V, dO, cnt, lse, scale):
    """bwd_tc_kernel for one window and head: dQ, dK, dV."""
    rows, dh = Q.shape
    n_src = K.shape[0]
    g, q = lane_gq()
    src_tiles, row_tiles = (n_src + 7) // 8, (rows + 7) // 8

    def stage(X, n):
        nk = np.zeros((128, dh))
        tr = np.zeros((dh, 128))
        for j in range(n):
            nk[staged_row(j) if tile.tf32 else j] = X[j]
            tr[:, j] = X[j]
        return nk, tr

    c = np.zeros((128, 128))
    c[:rows, :n_src] = cnt
    dq = np.full((rows, dh), np.nan)
    dk = np.full((n_src, dh), np.nan)
    dv = np.full((n_src, dh), np.nan)
    s_d = np.zeros(128)

    def product(x, k_tiles, nk, out, at_a, at_b, ok_a, ok_b, sc):
        acc = np.zeros((dh // 8, LANES, 4))
        for t in range(0, 16, tile.k // 8):
            if t < k_tiles:
                fa = tile.acc_to_a(x[t], x[t if tile.tf32 else t + 1])
                for nt in range(dh // 8):
                    tile.mma(acc[nt], fa, nk[nt * 8 + g], t * 8)
        for nt in range(dh // 8):
            f = nt * 8 + 2 * q
            for lane in range(LANES):
                if ok_a[lane]:
                    out[at_a[lane], f[lane]:f[lane] + 2] = \
                        acc[nt, lane, :2] * sc
                if ok_b[lane]:
                    out[at_b[lane], f[lane]:f[lane] + 2] = \
                        acc[nt, lane, 2:] * sc

    def rows_of(X, idx, ok):
        return np.where(ok[:, None], X[np.minimum(idx, len(X) - 1)], 0.)

    # A: row strips
    k_nk, k_t = stage(K, n_src)
    v_nk, _ = stage(V, n_src)
    s_lse = np.zeros(128)
    s_lse[:rows] = lse
    for r0 in range(0, rows, 16):
        ok_a, ok_b = r0 + g < rows, r0 + g + 8 < rows
        qa, qb = rows_of(Q, r0 + g, ok_a), rows_of(Q, r0 + g + 8, ok_b)
        oa, ob = rows_of(dO, r0 + g, ok_a), rows_of(dO, r0 + g + 8, ok_b)
        s = np.zeros((16, LANES, 4))
        dp = np.zeros((16, LANES, 4))
        for k0 in range(0, dh, tile.k):
            fq, fo = tile.load_a(qa, qb, k0), tile.load_a(oa, ob, k0)
            for t in range(src_tiles):
                tile.mma(s[t], fq, k_nk[t * 8 + g], k0)
                tile.mma(dp[t], fo, v_nk[t * 8 + g], k0)
        la = np.where(ok_a, s_lse[np.minimum(r0 + g, 127)], 0.)
        lb = np.where(ok_b, s_lse[np.minimum(r0 + g + 8, 127)], 0.)
        d_a, d_b = np.zeros(LANES), np.zeros(LANES)
        for t in range(16):
            for i in range(4):
                ok = (t < src_tiles) & (ok_a if i < 2 else ok_b)
                rr = np.minimum(r0 + g + (0 if i < 2 else 8), 127)
                cc = np.where(ok, c[rr, t * 8 + tile.column(q, i)], 0)
                with np.errstate(over='ignore', invalid='ignore'):
                    p = np.where(cc > 0, cc * np.exp(
                        s[t, :, i] * scale - (la if i < 2 else lb)), 0.)
                s[t, :, i] = p
                if i < 2:
                    d_a += p * dp[t, :, i]
                else:
                    d_b += p * dp[t, :, i]
        d_a, d_b = quad_reduce(d_a, np.add), quad_reduce(d_b, np.add)
        for lane in range(0, LANES, 4):
            if ok_a[lane]:
                s_d[r0 + g[lane]] = d_a[lane]
            if ok_b[lane]:
                s_d[r0 + g[lane] + 8] = d_b[lane]
        for t in range(16):
            for i in range(4):
                s[t, :, i] *= dp[t, :, i] - (d_a if i < 2 else d_b)
        product(s, src_tiles, k_t, dq, r0 + g, r0 + g + 8, ok_a, ok_b, scale)
    # B: source strips
    q_nk, q_t = stage(Q, rows)
    o_nk, o_t = stage(dO, rows)
    for c0 in range(0, n_src, 16):
        ok_a, ok_b = c0 + g < n_src, c0 + g + 8 < n_src
        ka, kb = rows_of(K, c0 + g, ok_a), rows_of(K, c0 + g + 8, ok_b)
        va, vb = rows_of(V, c0 + g, ok_a), rows_of(V, c0 + g + 8, ok_b)
        s = np.zeros((16, LANES, 4))
        dp = np.zeros((16, LANES, 4))
        for k0 in range(0, dh, tile.k):
            fk, fv = tile.load_a(ka, kb, k0), tile.load_a(va, vb, k0)
            for t in range(row_tiles):
                tile.mma(s[t], fk, q_nk[t * 8 + g], k0)
                tile.mma(dp[t], fv, o_nk[t * 8 + g], k0)
        for t in range(16):
            for i in range(4):
                r = t * 8 + tile.column(q, i)
                ok = (t < row_tiles) & (r < rows) & (ok_a if i < 2 else ok_b)
                src = np.minimum(c0 + g + (0 if i < 2 else 8), 127)
                cc = np.where(ok, c[np.minimum(r, 127), src], 0)
                rs = np.minimum(r, 127)
                with np.errstate(over='ignore', invalid='ignore'):
                    p = np.where(cc > 0, cc * np.exp(s[t, :, i] * scale -
                                                     s_lse[rs]), 0.)
                    ds = np.where(cc > 0, p * (dp[t, :, i] - s_d[rs]), 0.)
                s[t, :, i], dp[t, :, i] = p, ds
        product(s, row_tiles, o_t, dv, c0 + g, c0 + g + 8, ok_a, ok_b, 1.)
        product(dp, row_tiles, q_t, dk, c0 + g, c0 + g + 8, ok_a, ok_b,
                scale)
    return dq, dk, dv


def dense(Q, K, V, dO, cnt, scale):
    s = np.where(cnt > 0, scale * Q @ K.T, -np.inf)
    m = s.max(1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.)
    e = cnt * np.exp(s - m)
    l = e.sum(1, keepdims=True)
    P = e / np.where(l > 0, l, 1.)
    out = P @ V
    with np.errstate(divide='ignore'):
        lse = np.where(l[:, 0] > 0, m[:, 0] + np.log(l[:, 0]), -np.inf)
    dP = dO @ V.T
    D = (P * dP).sum(1, keepdims=True)
    dS = P * (dP - D)
    return out, lse, scale * dS @ K, scale * dS.T @ Q, P.T @ dO


def main():
    rng = np.random.default_rng(0)
    worst = 0.0
    for tf32, dh, rows, n_src in itertools.product(
            (True, False), (16, 32, 128), (1, 23, 119, 128), (1, 37, 128)):
        tile = Tile(tf32)
        Q, dO = rng.normal(size=(rows, dh)), rng.normal(size=(rows, dh))
        K, V = rng.normal(size=(n_src, dh)), rng.normal(size=(n_src, dh))
        cnt = rng.poisson(0.6, size=(rows, n_src)).astype(float)
        cnt[rng.random(rows) < 0.2] = 0  # empty rows
        scale = dh ** -0.5
        out, lse = forward(tile, Q, K, V, cnt, scale)
        ref = dense(Q, K, V, dO, cnt, scale)
        dq, dk, dv = backward(tile, Q, K, V, dO, cnt, lse, scale)
        for name, x, y in (('out', out, ref[0]), ('lse', lse, ref[1]),
                           ('dq', dq, ref[2]), ('dk', dk, ref[3]),
                           ('dv', dv, ref[4])):
            assert not np.isnan(x).any(), (name, tf32, dh, rows, n_src)
            fin = np.isfinite(y)
            assert (np.isfinite(x) == fin).all(), (name, tf32, dh, rows)
            if not fin.any():
                continue
            err = np.abs(x[fin] - y[fin]).max() / (np.abs(y[fin]).max() + 1)
            worst = max(worst, err)
            assert err < 1e-9, (name, tf32, dh, rows, n_src, err)
    print(f'fragment bookkeeping matches dense attention (worst {worst:.1e})')


if __name__ == '__main__':
    main()
