/* The scalar functions of the tilted reduction and of the losses, written once.
 *
 * This header compiles as host C (C99; the tests build it with a C compiler and call it
 * through ctypes) and inside the NVRTC kernels of this package (kernels.cu), so the code
 * the GPU runs is the code the CPU tests check. Element type: float when TL_FLOAT is 1,
 * else double. TL_HD qualifies every function: __host__ __device__ under NVRTC,
 * static inline on the host (a host build may define it empty to export the functions).
 *
 * The state of a set of samples at a tilt t (the C form of tiltlab.accumulator.TiltState):
 *   c     the shift: the largest loss for t > 0, the smallest for t <= 0 (or a value on
 *         that side of every loss, in a kernel whose lanes share one shift),
 *   hi/lo the largest and smallest loss,
 *   s     sum p exp(t (l - c)),  q  sum p expm1(t (l - c)),  lsum  sum p (l - c),
 *   mass  sum p (the number of samples under unit weights p = 1).
 * q is kept only while the losses and the shift span at most 1 / |t| (the risk reads it
 * only where hi - lo does); once they span more it is NaN (tiltlab.accumulator drops it
 * the same way), and each new loss then costs one exp instead of an exp and an expm1
 * (below it, one expm1: exp(u) = expm1(u) + 1 is accurate for u in [-1, 0], and the span
 * includes the shift because a shift shared by lanes may lie far beyond a lane's losses,
 * where expm1(u) + 1 would round a small factor away).
 * The empty state (mass 0, hi = -inf, lo = +inf, c = 0, sums 0) is the identity of the
 * merge; the merge and the moves of a shift test for it instead of multiplying infinite
 * shifts by zero masses, so that no inf * 0 or inf - inf is ever formed for it.
 */
#ifndef TILTLAB_TILT_CUH
#define TILTLAB_TILT_CUH

#ifdef __CUDACC_RTC__
#  ifndef TL_HD
#    define TL_HD __host__ __device__ __forceinline__
#  endif
#else
#  include <math.h>
#  ifndef TL_HD
#    define TL_HD static inline
#  endif
#endif

#ifndef TL_FLOAT
#  define TL_FLOAT 0
#endif

#if TL_FLOAT
typedef float tl_real;
#  define TL_EXP expf
#  define TL_EXPM1 expm1f
#  define TL_LOG logf
#  define TL_LOG1P log1pf
#  define TL_FABS fabsf
#else
typedef double tl_real;
#  define TL_EXP exp
#  define TL_EXPM1 expm1
#  define TL_LOG log
#  define TL_LOG1P log1p
#  define TL_FABS fabs
#endif

typedef struct {
    tl_real c, hi, lo, s, q, lsum, mass;
} tl_state;

/* the number of tl_real fields of a state (states are stored as rows of this many) */
#define TL_STATE_FIELDS 7

/* infinity and NaN from their bits, never by arithmetic: the GPU compiler contracts a
 * product and a sum into one fused multiply-add (NVRTC's default), which keeps the product
 * unrounded, so an expression such as big * big - inf can give -inf there where the host
 * gives NaN (the tests build the kernels with and without contraction) */
#ifdef __CUDACC_RTC__
#  if TL_FLOAT
#    define TL_INF_BITS __int_as_float(0x7f800000)
#    define TL_NAN_BITS __int_as_float(0x7fc00000)
#  else
#    define TL_INF_BITS __longlong_as_double(0x7ff0000000000000LL)
#    define TL_NAN_BITS __longlong_as_double(0x7ff8000000000000LL)
#  endif
#else
#  define TL_INF_BITS ((tl_real)INFINITY)
#  define TL_NAN_BITS ((tl_real)NAN)
#endif

TL_HD tl_real tl_inf(void) { return TL_INF_BITS; }

TL_HD tl_real tl_nan(void) { return TL_NAN_BITS; }

TL_HD int tl_finite(tl_real v) { return v - v == (tl_real)0; }

/* ------------------------------------------------------------------------------------
 * losses: value, first and second derivative in z at one point (label y, the loss's
 * parameter param: Huber's delta, the pinball quantile; unused by the others), written
 * from the table of tiltlab/losses/table.py (the same operations in the same order)
 */

/* sign(x): 1, -1, or 0 at 0 */
TL_HD tl_real tl_sign(tl_real x) { return x > 0 ? (tl_real)1 : (x < 0 ? (tl_real)-1 : (tl_real)0); }

TL_HD tl_real tl_max(tl_real a, tl_real b) { return a >= b ? a : b; }

/* BEGIN GENERATED LOSSES (python -m tiltlab.losses._generate; do not edit) */

/* squared error (z - y)^2 (no factor 1/2) */
TL_HD void tl_loss_squared(tl_real z, tl_real y, tl_real param, tl_real* l, tl_real* d1, tl_real* d2) {
    (void)param;
    const tl_real r = z - y;
    *l = r * r;
    *d1 = (tl_real)2 * r;
    *d2 = (tl_real)2;
}

/* absolute error |z - y|; d1 = sign(z - y), 0 at the kink */
TL_HD void tl_loss_absolute(tl_real z, tl_real y, tl_real param, tl_real* l, tl_real* d1, tl_real* d2) {
    (void)param;
    const tl_real r = z - y;
    *l = TL_FABS(r);
    *d1 = tl_sign(r);
    *d2 = (tl_real)0;
}

/* Huber: r^2/2 for |r| <= delta, else delta (|r| - delta/2); the quadratic side at |r| = delta */
TL_HD void tl_loss_huber(tl_real z, tl_real y, tl_real param, tl_real* l, tl_real* d1, tl_real* d2) {
    const tl_real delta = param;
    const tl_real r = z - y;
    const tl_real a = TL_FABS(r);
    const int inside = a <= delta;
    *l = (inside ? (tl_real)0.5 * r * r : delta * (a - (tl_real)0.5 * delta));
    *d1 = (inside ? r : delta * tl_sign(r));
    *d2 = (inside ? (tl_real)1 : (tl_real)0);
}

/* logistic: softplus(z) - y z; the sigmoid pair s(z), s(-z) from exp(-|z|) (never overflows), d1 = s(z) - y without cancellation */
TL_HD void tl_loss_logistic(tl_real z, tl_real y, tl_real param, tl_real* l, tl_real* d1, tl_real* d2) {
    (void)param;
    const tl_real e = TL_EXP(-TL_FABS(z));
    const tl_real inv = (tl_real)1 / ((tl_real)1 + e);
    const tl_real small = e * inv;
    const int pos = z >= (tl_real)0;
    const tl_real s = (pos ? inv : small);
    const tl_real sc = (pos ? small : inv);
    *l = tl_max(z, (tl_real)0) - y * z + TL_LOG1P(e);
    *d1 = ((tl_real)1 - y) * s - y * sc;
    *d2 = s * sc;
}

/* hinge: max(0, 1 - s z), s = 2y - 1; the flat side at a zero margin */
TL_HD void tl_loss_hinge(tl_real z, tl_real y, tl_real param, tl_real* l, tl_real* d1, tl_real* d2) {
    (void)param;
    const tl_real sgn = (tl_real)2 * y - (tl_real)1;
    const tl_real g = (tl_real)1 - sgn * z;
    const int on = g > (tl_real)0;
    *l = tl_max(g, (tl_real)0);
    *d1 = (on ? -sgn : (tl_real)0);
    *d2 = (tl_real)0;
}

/* squared hinge: max(0, 1 - s z)^2, s = 2y - 1; the flat side at a zero margin */
TL_HD void tl_loss_squared_hinge(tl_real z, tl_real y, tl_real param, tl_real* l, tl_real* d1, tl_real* d2) {
    (void)param;
    const tl_real sgn = (tl_real)2 * y - (tl_real)1;
    const tl_real g = (tl_real)1 - sgn * z;
    const int on = g > (tl_real)0;
    const tl_real h = tl_max(g, (tl_real)0);
    *l = h * h;
    *d1 = -(tl_real)2 * sgn * h;
    *d2 = (on ? (tl_real)2 : (tl_real)0);
}

/* half Poisson deviance, log link: exp(z) - y - y (z - log y) = y (expm1(w) - w), w = z - log y (exp(z) at y = 0); beyond w = 8 (no cancellation left) as exp(z) - y - y w, since y expm1(w) overflows for small y where exp(z) does not; smooth */
TL_HD void tl_loss_poisson(tl_real z, tl_real y, tl_real param, tl_real* l, tl_real* d1, tl_real* d2) {
    (void)param;
    const tl_real ez = TL_EXP(z);
    const int pos = y > (tl_real)0;
    const tl_real w = z - TL_LOG((pos ? y : (tl_real)1));
    const int far = w > (tl_real)8;
    const tl_real em = TL_EXPM1((far ? (tl_real)0 : w));
    *l = (pos ? (far ? ez - y * ((tl_real)1 + w) : y * (em - w)) : ez);
    *d1 = (pos ? (far ? ez - y : y * em) : ez);
    *d2 = ez;
}

/* pinball (quantile): max(q r, (q - 1) r), r = y - z; d1 = 0 at the kink, as the absolute loss's (which is twice the pinball loss at q = 1/2) */
TL_HD void tl_loss_pinball(tl_real z, tl_real y, tl_real param, tl_real* l, tl_real* d1, tl_real* d2) {
    const tl_real quantile = param;
    const tl_real r = y - z;
    *l = tl_max(quantile * r, (quantile - (tl_real)1) * r);
    *d1 = (r > (tl_real)0 ? -quantile : (r < (tl_real)0 ? (tl_real)1 - quantile : (tl_real)0));
    *d2 = (tl_real)0;
}

/* END GENERATED LOSSES */

/* ------------------------------------------------------------------------------------
 * the tilted state
 */

/* the identity of the merge */
TL_HD tl_state tl_empty(void) {
    tl_state e;
    e.c = (tl_real)0;
    e.hi = -tl_inf();
    e.lo = tl_inf();
    e.s = e.q = e.lsum = e.mass = (tl_real)0;
    return e;
}

TL_HD int tl_is_empty(const tl_state* st) { return !(st->mass > (tl_real)0); }

/* t (a - b), finite when a - b overflows but the product does not, and 0 for a == b
 * at every tilt (an infinite tilt weighs the extreme losses only) */
TL_HD tl_real tl_gap(tl_real t, tl_real a, tl_real b) {
    if (a == b) return (tl_real)0;
    const tl_real d = a - b;
    if (tl_finite(d) || !(tl_finite(a) && tl_finite(b))) return t * d;
    return (t * (a * (tl_real)0.5 - b * (tl_real)0.5)) * (tl_real)2;
}

/* c + logz / t, taken in halves where logz / t overflows but the sum does not */
TL_HD tl_real tl_add_scaled(tl_real c, tl_real logz, tl_real t) {
    const tl_real r = c + logz / t;
    if (tl_finite(r)) return r;
    return (c * (tl_real)0.5 + (logz * (tl_real)0.5) / t) * (tl_real)2;
}

/* the steps of the state's arithmetic (weight, fold, move, factor, merge, finish), written from
 * the table of tiltlab/accumulator/state_table.py; the functions below add the control around
 * them (the empty state, the choice of the shift, when q is dropped) */

/* BEGIN GENERATED STATE (python -m tiltlab.losses._generate; do not edit) */

/* the weight e = exp(u) of one loss l at the shift c, u = t (l - c) <= 0, and e1 = expm1(u); near t = 0 (small_tilt: u in [-1, 0]) e = e1 + 1 (one transcendental), else e1 = 0 (the state drops q) */
TL_HD void tl_state_weight(tl_real t, tl_real l, tl_real c, int small_tilt, tl_real* o_e, tl_real* o_e1) {
    const tl_real u = tl_gap(t, l, c);
    const tl_real e1 = (small_tilt ? TL_EXPM1(u) : (tl_real)0);
    *o_e = (small_tilt ? e1 + (tl_real)1 : TL_EXP(u));
    *o_e1 = e1;
}

/* the fold of one loss l of prior weight p and weights e, e1 (weight) into the sums of a state of shift c */
TL_HD void tl_state_fold(tl_real p, tl_real l, tl_real c, tl_real e, tl_real e1, tl_real mass, tl_real s, tl_real q, tl_real lsum, tl_real* o_mass, tl_real* o_s, tl_real* o_q, tl_real* o_lsum) {
    *o_mass = mass + p;
    *o_s = s + p * e;
    *o_q = q + p * e1;
    *o_lsum = lsum + p * (l - c);
}

/* the sums of a state moved from the shift c to the shift to (on the tilt's side of c: u = t (c - to) <= 0); r = exp(u) scales every weighted sum, q gains mass expm1(u), a term of its own sign (no cancellation) */
TL_HD void tl_state_move(tl_real t, tl_real c, tl_real to, tl_real mass, tl_real s, tl_real q, tl_real lsum, tl_real* o_r, tl_real* o_s, tl_real* o_q, tl_real* o_lsum) {
    const tl_real u = tl_gap(t, c, to);
    const tl_real r = TL_EXP(u);
    *o_r = r;
    *o_s = s * r;
    *o_q = mass * TL_EXPM1(u) + q * r;
    *o_lsum = lsum + mass * (c - to);
}

/* the factor exp(t (c - to)) that moves weighted sums from the shift c to the shift to (move's r, for sums kept apart from a state's) */
TL_HD tl_real tl_state_factor(tl_real t, tl_real c, tl_real to) {
    return TL_EXP(tl_gap(t, c, to));
}

/* the merge of two states moved to one shift (move): their sums added */
TL_HD void tl_state_merge(tl_real mass_a, tl_real s_a, tl_real q_a, tl_real lsum_a, tl_real mass_b, tl_real s_b, tl_real q_b, tl_real lsum_b, tl_real* o_mass, tl_real* o_s, tl_real* o_q, tl_real* o_lsum) {
    *o_mass = mass_a + mass_b;
    *o_s = s_a + s_b;
    *o_q = q_a + q_b;
    *o_lsum = lsum_a + lsum_b;
}

/* the tilted risk of a state: its largest (smallest) loss at an infinite tilt (extreme), the mean c + lsum / mass at t = 0 and where |t| (hi - lo) is below rounding (flat), c + log1p(q / mass) / t while |t| (hi - lo) <= 1 and q is kept (small_tilt), else c + log(s / mass) / t */
TL_HD tl_real tl_state_finish(tl_real t, tl_real c, tl_real hi, tl_real lo, tl_real mass, tl_real s, tl_real q, tl_real lsum, int extreme, int flat, int small_tilt) {
    return (extreme ? (t > (tl_real)0 ? hi : lo) : (flat ? c + lsum / mass : (small_tilt ? tl_add_scaled(c, TL_LOG1P(q / mass), t) : tl_add_scaled(c, TL_LOG(s / mass), t))));
}

/* END GENERATED STATE */

/* whether the loss l lies beyond the shift c on the tilt's side (it must become the shift) */
TL_HD int tl_beyond(tl_real l, tl_real c, tl_real t) {
    return (t > (tl_real)0) ? (l > c) : (l < c);
}

/* move the sums of a state to the shift c (c on the tilt's side of st->c); returns the
 * factor exp(t (st->c - c)) that scales the state's weighted sums (0 for the empty
 * state, which has none: its shift is set without arithmetic) */
TL_HD tl_real tl_move(tl_state* st, tl_real c, tl_real t) {
    if (tl_is_empty(st)) {
        st->c = c;
        return (tl_real)0;
    }
    if (c == st->c) return (tl_real)1;
    tl_real r;  /* a dropped q (NaN) stays NaN */
    tl_state_move(t, st->c, c, st->mass, st->s, st->q, st->lsum, &r, &st->s, &st->q, &st->lsum);
    st->c = c;
    return r;
}

/* whether values spanning [lo, hi] lie within 1 / |t| of one another */
TL_HD int tl_small_range(tl_real t, tl_real hi, tl_real lo) {
    return tl_gap(TL_FABS(t), hi, lo) <= (tl_real)1;
}

/* whether a state keeps its sums q: its losses and its shift within 1 / |t| */
TL_HD int tl_keeps_q(const tl_state* st, tl_real t) {
    const tl_real top = st->c > st->hi ? st->c : st->hi;
    const tl_real bottom = st->c < st->lo ? st->c : st->lo;
    return tl_small_range(t, top, bottom);
}

/* add one sample of loss l and prior weight p > 0 to a state whose shift is already on
 * the tilt's side of l; returns the sample's factor exp(t (l - c)), taken as
 * expm1(u) + 1 while the state's q is kept (one transcendental either way) */
TL_HD tl_real tl_add_w(tl_state* st, tl_real l, tl_real p, tl_real t) {
    st->hi = l > st->hi ? l : st->hi;
    st->lo = l < st->lo ? l : st->lo;
    const int small_tilt = st->q == st->q && tl_keeps_q(st, t);  /* u in [-1, 0] */
    tl_real e, e1;
    tl_state_weight(t, l, st->c, small_tilt, &e, &e1);
    tl_state_fold(p, l, st->c, e, e1, st->mass, st->s, st->q, st->lsum, &st->mass, &st->s,
                  &st->q, &st->lsum);
    if (!small_tilt) st->q = tl_nan();
    return e;
}

/* the same with unit weight */
TL_HD tl_real tl_add(tl_state* st, tl_real l, tl_real t) {
    return tl_add_w(st, l, (tl_real)1, t);
}

/* add one sample of prior weight p > 0, moving the shift to it when it lies beyond; *r
 * receives the factor of the older weighted sums, the sample's factor is returned */
TL_HD tl_real tl_push_w(tl_state* st, tl_real l, tl_real p, tl_real t, tl_real* r) {
    *r = (tl_real)1;
    if (tl_is_empty(st)) {
        st->c = l;
        *r = (tl_real)0;
    } else if (tl_beyond(l, st->c, t)) {
        *r = tl_move(st, l, t);
    }
    return tl_add_w(st, l, p, t);
}

/* the same with unit weight */
TL_HD tl_real tl_push(tl_state* st, tl_real l, tl_real t, tl_real* r) {
    return tl_push_w(st, l, (tl_real)1, t, r);
}

/* the merge of two states (exact up to rounding, associative, the empty state its
 * identity); *fa and *fb receive the factors of a's and b's weighted sums */
TL_HD tl_state tl_merge(tl_state a, tl_state b, tl_real t, tl_real* fa, tl_real* fb) {
    if (tl_is_empty(&b)) {
        *fa = (tl_real)1;
        *fb = (tl_real)0;
        return a;
    }
    if (tl_is_empty(&a)) {
        *fa = (tl_real)0;
        *fb = (tl_real)1;
        return b;
    }
    const tl_real c = tl_beyond(b.c, a.c, t) ? b.c : a.c;
    *fa = tl_move(&a, c, t);
    *fb = tl_move(&b, c, t);
    tl_state m;
    m.c = c;
    m.hi = a.hi > b.hi ? a.hi : b.hi;
    m.lo = a.lo < b.lo ? a.lo : b.lo;
    tl_state_merge(a.mass, a.s, a.q, a.lsum, b.mass, b.s, b.q, b.lsum, &m.mass, &m.s, &m.q,
                   &m.lsum);
    if (!tl_keeps_q(&m, t)) m.q = tl_nan();
    return m;
}

/* whether a state's losses were all finite (else its risk is not a number to trust) */
TL_HD int tl_state_finite(const tl_state* st) {
    return tl_is_empty(st) || (tl_finite(st->hi) && tl_finite(st->lo) && tl_finite(st->s));
}

/* the tilted risk of a state, by the rule of tiltlab.accumulator: the mean (relative to
 * the shift) at t = 0 and while |t| (hi - lo) < tiny, log1p of the expm1 sums while
 * |t| (hi - lo) <= 1, the log of the exp sums otherwise; the largest (smallest) loss at
 * t = +inf (-inf); NaN for the empty state */
TL_HD tl_real tl_risk(tl_state st, tl_real t, tl_real tiny) {
    if (tl_is_empty(&st)) return tl_nan();
    const int extreme = !tl_finite(t);
    const tl_real scale = extreme || t == (tl_real)0 ? (tl_real)0 : tl_gap(TL_FABS(t), st.hi, st.lo);
    const int flat = t == (tl_real)0 || scale < tiny;
    /* q dropped (NaN) with a range this small: a shift beyond the losses (a lane's state) */
    const int small_tilt = scale <= (tl_real)1 && st.q == st.q;
    return tl_state_finish(t, st.c, st.hi, st.lo, st.mass, st.s, st.q, st.lsum, extreme, flat,
                           small_tilt);
}

/* the share of a part (a merged-in state g) in the normalised sums of the whole state:
 * exp(t (g.c - whole.c)) / whole.s, 0 for an empty part */
TL_HD tl_real tl_share(tl_state g, tl_state whole, tl_real t) {
    if (tl_is_empty(&g)) return (tl_real)0;
    return tl_state_factor(t, g.c, whole.c) / whole.s;
}

#endif /* TILTLAB_TILT_CUH */
