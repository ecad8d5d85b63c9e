//! Exact rationals over `i128` with a double fallback: the value type of the math verifier
//! ([`super::math`]) and of the countdown verifier's default mode ([`super::countdown`]).
//!
//! A value is either exact, `n/d` with `d > 0` and `gcd(|n|, d) = 1`, or, once an `i128`
//! operation would overflow, an approximation in `f64` (`Approx`). Each operation stays exact
//! while its result fits: products are cross-reduced first (`(a/b)·(c/d)` multiplies
//! `a/gcd(a,d)` by `c/gcd(c,b)`), the sum of two integers skips the gcd, and only an overflow
//! that remains after reduction falls back to doubles. How a fallback value is compared is the
//! caller's rule (math: relative 1e-9; countdown: absolute 1e-5).
//!
//! TinyZero's mode evaluates with Python's semantics instead (floats, unbounded ints): see
//! [`super::pyexpr`] and [`super::bigint`].

/// An exact rational `n/d` (`d > 0`, reduced) or, after an `i128` overflow, an approximation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rational {
    /// `n/d`, `d > 0`, `gcd(|n|, d) = 1`.
    Exact(i128, i128),
    /// A double, after an operation whose exact result does not fit an `i128` fraction.
    Approx(f64),
}

/// `gcd(|a|, |b|)`, total (the magnitude of `i128::MIN` is `2^127`, which fits a `u128`).
fn gcd(a: i128, b: i128) -> u128 {
    let (mut a, mut b) = (a.unsigned_abs(), b.unsigned_abs());
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// `x / g` for `g` a divisor of `|x|` (as returned by [`gcd`]).
fn div_exact(x: i128, g: u128) -> i128 {
    match i128::try_from(g) {
        Ok(g) => x / g,
        // g = 2^127 divides only 0 and i128::MIN
        Err(_) => -((x != 0) as i128),
    }
}

impl Rational {
    /// The integer `v`.
    pub fn int(v: i128) -> Rational {
        Rational::Exact(v, 1)
    }

    /// `n/d` reduced; `None` when `d = 0`. When the sign cannot move to the numerator
    /// (`i128::MIN` in the reduced denominator) the value is approximated.
    pub fn new(n: i128, d: i128) -> Option<Rational> {
        (d != 0).then(|| Rational::make(Some(n), Some(d), || n as f64 / d as f64))
    }

    /// `n/d` reduced from checked parts: `approx` gives the value when a part overflowed (`None`)
    /// or the sign cannot be normalised. A zero denominator must be excluded by the caller
    /// (it approximates, as a fallback, to whatever `approx` says).
    fn make(n: Option<i128>, d: Option<i128>, approx: impl FnOnce() -> f64) -> Rational {
        match (n, d) {
            (Some(n), Some(d)) if d != 0 => {
                let g = gcd(n, d);
                let (n, d) = if g > 1 {
                    (div_exact(n, g), div_exact(d, g))
                } else {
                    (n, d)
                };
                if d > 0 {
                    return Rational::Exact(n, d);
                }
                match (n.checked_neg(), d.checked_neg()) {
                    (Some(n), Some(d)) => Rational::Exact(n, d),
                    _ => Rational::Approx(approx()),
                }
            }
            _ => Rational::Approx(approx()),
        }
    }

    /// The nearest double (`n as f64 / d as f64` for an exact value).
    pub fn to_f64(self) -> f64 {
        match self {
            Rational::Exact(n, d) => n as f64 / d as f64,
            Rational::Approx(f) => f,
        }
    }

    /// `self + sign·o` for `sign ∈ {1, −1}`.
    fn add_signed(self, o: Rational, sign: i128) -> Rational {
        match (self, o) {
            // integers (the common case): no gcd
            (Rational::Exact(a, 1), Rational::Exact(c, 1)) => {
                match c.checked_mul(sign).and_then(|c| a.checked_add(c)) {
                    Some(n) => Rational::Exact(n, 1),
                    None => Rational::Approx(a as f64 + sign as f64 * c as f64),
                }
            }
            (Rational::Exact(a, b), Rational::Exact(c, d)) => {
                let c = c.checked_mul(sign);
                let n = c.and_then(|c| a.checked_mul(d)?.checked_add(c.checked_mul(b)?));
                Rational::make(n, b.checked_mul(d), || {
                    self.to_f64() + sign as f64 * o.to_f64()
                })
            }
            _ => Rational::Approx(self.to_f64() + sign as f64 * o.to_f64()),
        }
    }

    /// `self · o`, cross-reduced first to keep the numbers small.
    fn times(self, o: Rational) -> Rational {
        match (self, o) {
            (Rational::Exact(a, 1), Rational::Exact(c, 1)) => match a.checked_mul(c) {
                Some(n) => Rational::Exact(n, 1),
                None => Rational::Approx(a as f64 * c as f64),
            },
            (Rational::Exact(a, b), Rational::Exact(c, d)) => {
                let (g1, g2) = (gcd(a, d).max(1), gcd(c, b).max(1));
                let n = div_exact(a, g1).checked_mul(div_exact(c, g2));
                let den = div_exact(b, g2).checked_mul(div_exact(d, g1));
                Rational::make(n, den, || self.to_f64() * o.to_f64())
            }
            _ => Rational::Approx(self.to_f64() * o.to_f64()),
        }
    }

    /// `self / o`; `None` on division by zero (exact `0` or an approximate `±0.0`).
    pub fn checked_div(self, o: Rational) -> Option<Rational> {
        match o {
            Rational::Exact(0, _) => None,
            Rational::Approx(0.0) => None,
            Rational::Exact(c, d) => match self {
                Rational::Exact(..) => {
                    Some(self.times(Rational::make(Some(d), Some(c), || d as f64 / c as f64)))
                }
                Rational::Approx(f) => Some(Rational::Approx(f / (c as f64 / d as f64))),
            },
            Rational::Approx(f) => Some(Rational::Approx(self.to_f64() / f)),
        }
    }

    /// `−self`.
    fn negate(self) -> Rational {
        match self {
            Rational::Exact(n, d) => match n.checked_neg() {
                Some(n) => Rational::Exact(n, d),
                None => Rational::Approx(-self.to_f64()),
            },
            Rational::Approx(f) => Rational::Approx(-f),
        }
    }
}

impl std::ops::Add for Rational {
    type Output = Rational;
    fn add(self, o: Rational) -> Rational {
        self.add_signed(o, 1)
    }
}

impl std::ops::Sub for Rational {
    type Output = Rational;
    fn sub(self, o: Rational) -> Rational {
        self.add_signed(o, -1)
    }
}

impl std::ops::Mul for Rational {
    type Output = Rational;
    fn mul(self, o: Rational) -> Rational {
        self.times(o)
    }
}

impl std::ops::Neg for Rational {
    type Output = Rational;
    fn neg(self) -> Rational {
        self.negate()
    }
}

#[cfg(test)]
mod tests {
    use super::Rational::{self, Approx, Exact};
    use proptest::prelude::*;

    fn q(n: i128, d: i128) -> Rational {
        Rational::new(n, d).unwrap()
    }

    #[test]
    fn reduces_and_normalises_the_sign() {
        assert_eq!(q(6, -4), Exact(-3, 2));
        assert_eq!(q(0, -7), Exact(0, 1));
        assert_eq!(Rational::new(1, 0), None);
        // the extremes reduce without overflow: 2^127 divides both
        assert_eq!(q(i128::MIN, i128::MIN), Exact(1, 1));
        assert_eq!(q(0, i128::MIN), Exact(0, 1));
        assert_eq!(q(i128::MIN, 2), Exact(i128::MIN / 2, 1));
        // 1 / i128::MIN: the sign cannot move up, so it is approximated
        assert_eq!(q(1, i128::MIN), Approx(1.0 / i128::MIN as f64));
    }

    #[test]
    fn hand_figures() {
        // 1/6 + 1/3 = 1/2; 1/2 − 3/4 = −1/4; (2/3)·(9/4) = 3/2; (3/4) / (−9/8) = −2/3
        assert_eq!(q(1, 6) + q(1, 3), Exact(1, 2));
        assert_eq!(q(1, 2) - q(3, 4), Exact(-1, 4));
        assert_eq!(q(2, 3) * q(9, 4), Exact(3, 2));
        assert_eq!(q(3, 4).checked_div(q(-9, 8)), Some(Exact(-2, 3)));
        assert_eq!(q(3, 4).checked_div(Rational::int(0)), None);
        assert_eq!(q(3, 4).checked_div(Approx(-0.0)), None);
        assert_eq!(-q(5, 7), Exact(-5, 7));
    }

    #[test]
    fn overflow_falls_back_to_doubles() {
        let big = Rational::int(i128::MAX);
        assert_eq!(big + Rational::int(1), Approx(i128::MAX as f64 + 1.0));
        assert_eq!(big * Rational::int(2), Approx(i128::MAX as f64 * 2.0));
        assert_eq!(-Rational::int(i128::MIN), Approx(-(i128::MIN as f64)));
        // cross-reduction keeps (2^100 / 3) · (3 / 2^90) exact: 2^10
        let p100 = 1i128 << 100;
        assert_eq!(q(p100, 3) * q(3, 1 << 90), Exact(1024, 1));
        assert_eq!(q(p100, 3).checked_div(q(1 << 90, 3)), Some(Exact(1024, 1)));
    }

    proptest! {
        // Small fractions agree with a hand-rolled cross-multiplication on i128.
        #[test]
        fn ops_match_cross_multiplication(a in -999i128..999, b in 1i128..999, c in -999i128..999, d in 1i128..999) {
            let (x, y) = (q(a, b), q(c, d));
            prop_assert_eq!(x + y, q(a * d + c * b, b * d));
            prop_assert_eq!(x - y, q(a * d - c * b, b * d));
            prop_assert_eq!(x * y, q(a * c, b * d));
            prop_assert_eq!(x.checked_div(y), Rational::new(a * d, b * c));
        }
    }
}
