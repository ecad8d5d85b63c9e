//! Python integers, just enough to evaluate countdown equations with Python's integer semantics
//! (TinyZero `eval`s them, and Python integers never overflow).
//!
//! Design: [`Int`] keeps values that fit in an `i128` inline (every realistic countdown equation
//! stays there, so the fast path allocates nothing) and promotes to a `num-bigint`
//! [`BigInt`] when a checked `i128` operation overflows. What is Python's and not the crate's is
//! here: floor division (`//`), the correctly rounded true division `int / int`
//! (`long_true_divide`) and `float(int)`, both to nearest, ties to even, with subnormal results
//! and the `OverflowError` when the result does not fit a double, and a size bound.
//!
//! Bound: no value may exceed [`MAX_BITS`] bits (about 19,700 decimal digits). Python would go on
//! computing (or run out of memory on `9**9**9**9`); here such an operation fails with
//! [`IntError::TooLarge`], which the evaluator maps to "not evaluable", the same outcome as any
//! Python exception. A countdown equation can only use the given numbers once each, so a result
//! that large cannot come back to a small target except by an equally large operation.
pub use num_bigint::BigInt;
use num_bigint::{BigUint, Sign};

/// Largest magnitude, in bits, of any integer the evaluator will build.
pub const MAX_BITS: u64 = 1 << 16;

/// Why an integer operation has no value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntError {
    /// Division or modulo by zero (Python `ZeroDivisionError`).
    ZeroDivision,
    /// The result would not fit a double (Python `OverflowError`).
    Overflow,
    /// The result would exceed [`MAX_BITS`] (Python would keep going; we stop).
    TooLarge,
}

/// A Python `int`: inline when it fits in an `i128`, big otherwise (never both for one value).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Int {
    Small(i128),
    Big(BigInt),
}

// ---------------------------------------------------------------------------------------------
// rounding to doubles

/// Top 64 bits of a magnitude (as an integer < 2^64), the exponent to scale them back and
/// whether any lower bit was set.
fn top64(a: &BigUint) -> (u64, i64, bool) {
    let bits = a.bits();
    if bits <= 64 {
        return (a.iter_u64_digits().next().unwrap_or(0), 0, false);
    }
    let shift = bits - 64;
    let top = (a >> shift).iter_u64_digits().next().unwrap_or(0);
    let sticky = a.trailing_zeros().is_some_and(|tz| tz < shift);
    (top, shift as i64, sticky)
}

/// Nearest double to a big integer, ties to even; `Err(Overflow)` beyond the double range.
fn big_to_f64(b: &BigInt) -> Result<f64, IntError> {
    let (top, e, sticky) = top64(b.magnitude());
    let v = round_to_f64(top, sticky, e)?;
    Ok(if b.sign() == Sign::Minus { -v } else { v })
}

/// Correctly rounded `(m + delta) * 2^e` where `delta` in (0,1) iff `sticky`, to nearest, ties to
/// even, with subnormals. Needs `m` to carry at least two bits beyond the 53 kept when `sticky`
/// (callers pass 55+ bits). `Err(Overflow)` when the result is not finite.
fn round_to_f64(m: u64, sticky: bool, e: i64) -> Result<f64, IntError> {
    if m == 0 {
        return Ok(0.0);
    }
    let nbits = 64 - m.leading_zeros() as i64;
    // drop enough low bits for 53 significant bits, more when the result is subnormal
    let drop = (nbits - 53).max(-1074 - e);
    let (kept, exp) = if drop <= 0 {
        (m as u128, e)
    } else if drop > 64 {
        (0u128, e + drop)
    } else {
        let m = m as u128;
        let kept = m >> drop;
        let rem = m & ((1u128 << drop) - 1);
        let half = 1u128 << (drop - 1);
        let up = rem > half || (rem == half && (sticky || kept & 1 == 1));
        (kept + up as u128, e + drop)
    };
    if kept == 0 {
        return Ok(0.0);
    }
    let kbits = 128 - kept.leading_zeros() as i64;
    if exp + kbits > 1024 {
        return Err(IntError::Overflow);
    }
    // kept < 2^54 and exp >= -1074: kept * 2^exp is exactly representable (or overflows, checked)
    let v = (kept as f64) * pow2(exp);
    if v.is_finite() {
        Ok(v)
    } else {
        Err(IntError::Overflow)
    }
}

/// `2^e` as a double for -1074 <= e <= 1023.
fn pow2(e: i64) -> f64 {
    if e >= -1022 {
        f64::from_bits(((e + 1023) as u64) << 52)
    } else {
        f64::from_bits(1u64 << (e + 1074))
    }
}

// ---------------------------------------------------------------------------------------------

impl Int {
    fn from_big(b: BigInt) -> Int {
        match i128::try_from(&b) {
            Ok(v) => Int::Small(v),
            Err(_) => Int::Big(b),
        }
    }

    fn to_big(&self) -> BigInt {
        match self {
            Int::Small(v) => BigInt::from(*v),
            Int::Big(b) => b.clone(),
        }
    }

    fn checked(b: BigInt) -> Result<Int, IntError> {
        if b.bits() > MAX_BITS {
            Err(IntError::TooLarge)
        } else {
            Ok(Int::from_big(b))
        }
    }

    /// A decimal literal: ASCII digits only, leading zeros allowed here (the tokenizer enforces
    /// Python's literal rules); `None` for anything else (an empty string, a sign, `_`).
    pub fn from_decimal(digits: &str) -> Option<Int> {
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        if digits.len() <= 38 {
            // at most 38 ASCII digits always fit an i128
            if let Ok(v) = digits.parse::<i128>() {
                return Some(Int::Small(v));
            }
        }
        digits.parse::<BigInt>().ok().map(Int::from_big)
    }

    pub fn is_zero(&self) -> bool {
        matches!(self, Int::Small(0))
    }

    pub fn is_negative(&self) -> bool {
        match self {
            Int::Small(v) => *v < 0,
            Int::Big(b) => b.sign() == Sign::Minus,
        }
    }

    pub fn as_i128(&self) -> Option<i128> {
        match self {
            Int::Small(v) => Some(*v),
            Int::Big(_) => None,
        }
    }

    pub fn neg(&self) -> Result<Int, IntError> {
        match self {
            Int::Small(v) => Ok(match v.checked_neg() {
                Some(n) => Int::Small(n),
                None => Int::Big(-BigInt::from(*v)),
            }),
            Int::Big(b) => Ok(Int::from_big(-b)),
        }
    }

    pub fn add(&self, o: &Int) -> Result<Int, IntError> {
        if let (Int::Small(a), Int::Small(b)) = (self, o) {
            if let Some(s) = a.checked_add(*b) {
                return Ok(Int::Small(s));
            }
        }
        Int::checked(self.to_big() + o.to_big())
    }

    pub fn sub(&self, o: &Int) -> Result<Int, IntError> {
        if let (Int::Small(a), Int::Small(b)) = (self, o) {
            if let Some(s) = a.checked_sub(*b) {
                return Ok(Int::Small(s));
            }
        }
        Int::checked(self.to_big() - o.to_big())
    }

    pub fn mul(&self, o: &Int) -> Result<Int, IntError> {
        if let (Int::Small(a), Int::Small(b)) = (self, o) {
            if let Some(s) = a.checked_mul(*b) {
                return Ok(Int::Small(s));
            }
        }
        let (a, b) = (self.to_big(), o.to_big());
        if a.bits() + b.bits() > MAX_BITS + 1 {
            return Err(IntError::TooLarge);
        }
        Int::checked(a * b)
    }

    /// Python `a // b` (floor).
    pub fn floordiv(&self, o: &Int) -> Result<Int, IntError> {
        if o.is_zero() {
            return Err(IntError::ZeroDivision);
        }
        if let (Int::Small(a), Int::Small(b)) = (self, o) {
            if let Some(q) = a.checked_div(*b) {
                // ok: b != 0 and a / b did not overflow, so a % b cannot either
                let r = a % b;
                let q = if r != 0 && ((r < 0) != (*b < 0)) {
                    q - 1
                } else {
                    q
                };
                return Ok(Int::Small(q));
            }
        }
        // num-bigint's `/` truncates and `%` takes the dividend's sign, as Rust's do
        let (a, b) = (self.to_big(), o.to_big());
        let (q, r) = (&a / &b, &a % &b);
        let floor =
            r.sign() != Sign::NoSign && (r.sign() == Sign::Minus) != (b.sign() == Sign::Minus);
        Ok(Int::from_big(if floor { q - 1 } else { q }))
    }

    /// Python `a ** e` for `e >= 0`.
    pub fn pow(&self, e: &Int) -> Result<Int, IntError> {
        debug_assert!(!e.is_negative());
        // trivial bases never grow, whatever the exponent
        match self {
            Int::Small(0) => return Ok(Int::Small(if e.is_zero() { 1 } else { 0 })),
            Int::Small(1) => return Ok(Int::Small(1)),
            Int::Small(-1) => {
                let odd = match e {
                    Int::Small(v) => v & 1 == 1,
                    Int::Big(b) => b.bit(0),
                };
                return Ok(Int::Small(if odd { -1 } else { 1 }));
            }
            _ => {}
        }
        let exp = match e.as_i128() {
            Some(v) if v <= MAX_BITS as i128 => v as u32,
            _ => return Err(IntError::TooLarge),
        };
        let base_bits = match self {
            Int::Small(v) => 128 - v.unsigned_abs().leading_zeros() as u64,
            Int::Big(b) => b.bits(),
        };
        // |base| >= 2 here, so the result has at least (base_bits - 1) * exp + 1 bits; this also
        // bounds the work below to at most 2 * MAX_BITS bits
        if exp > 0 && (base_bits - 1) * exp as u64 + 1 > MAX_BITS {
            return Err(IntError::TooLarge);
        }
        if let Int::Small(v) = self {
            if let Some(p) = v.checked_pow(exp) {
                return Ok(Int::Small(p));
            }
        }
        Int::checked(self.to_big().pow(exp))
    }

    /// Python `float(a)`: nearest double, ties to even; `Err(Overflow)` beyond the double range.
    pub fn to_f64(&self) -> Result<f64, IntError> {
        match self {
            Int::Small(v) => Ok(*v as f64),
            Int::Big(b) => big_to_f64(b),
        }
    }

    /// Python `a / b` on integers (`long_true_divide`): the correctly rounded quotient.
    pub fn truediv(&self, o: &Int) -> Result<f64, IntError> {
        if o.is_zero() {
            return Err(IntError::ZeroDivision);
        }
        const EXACT: u128 = 1 << 53;
        if let (Int::Small(a), Int::Small(b)) = (self, o) {
            if a.unsigned_abs() <= EXACT && b.unsigned_abs() <= EXACT {
                return Ok(*a as f64 / *b as f64);
            }
        }
        let neg = self.is_negative() != o.is_negative();
        let (a, b) = (self.to_big(), o.to_big());
        let (a, b) = (a.magnitude(), b.magnitude());
        if a.bits() == 0 {
            return Ok(if neg { -0.0 } else { 0.0 });
        }
        let e0 = a.bits() as i64 - b.bits() as i64; // 2^(e0-1) < |a/b| < 2^(e0+1)
        if e0 > 1025 {
            return Err(IntError::Overflow);
        }
        if e0 < -1080 {
            return Ok(if neg { -0.0 } else { 0.0 });
        }
        // q = floor(|a| 2^k / |b|) has 55 or 56 bits
        let k = 55 - e0;
        let (num, den) = if k >= 0 {
            (a << k as u64, b.clone())
        } else {
            (a.clone(), b << (-k) as u64)
        };
        let (q, r) = (&num / &den, &num % &den);
        let (top, e, sticky_q) = top64(&q);
        let v = round_to_f64(top, sticky_q || r.bits() != 0, e - k)?;
        Ok(if neg { -v } else { v })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn big(s: &str) -> Int {
        let (neg, d) = match s.strip_prefix('-') {
            Some(d) => (true, d),
            None => (false, s),
        };
        let v = Int::from_decimal(d).unwrap();
        if neg {
            v.neg().unwrap()
        } else {
            v
        }
    }

    fn to_dec(v: &Int) -> String {
        v.to_big().to_string()
    }

    #[test]
    fn python_figures_for_big_integers() {
        // figures from CPython 3.11
        let a = big("2").pow(&big("200")).unwrap();
        assert_eq!(
            to_dec(&a),
            "1606938044258990275541962092341162602522202993782792835301376"
        );
        let q = a.floordiv(&big("-7")).unwrap();
        assert_eq!(
            to_dec(&q),
            "-229562577751284325077423156048737514646028999111827547900197"
        );
        let p = big("99").pow(&big("99")).unwrap();
        assert_eq!(
            to_dec(&p.floordiv(&big("99").pow(&big("97")).unwrap()).unwrap()),
            "9801"
        );
        // 10**400 / 10**399 == 10.0; 10**309 / 1 overflows; 1 / 10**400 == 0.0
        let t400 = big("10").pow(&big("400")).unwrap();
        let t399 = big("10").pow(&big("399")).unwrap();
        assert_eq!(t400.truediv(&t399), Ok(10.0));
        assert_eq!(
            big("10").pow(&big("309")).unwrap().truediv(&big("1")),
            Err(IntError::Overflow)
        );
        assert_eq!(big("1").truediv(&t400), Ok(0.0));
        assert_eq!(
            big("10").pow(&big("309")).unwrap().truediv(&big("10")),
            Ok(1e308)
        );
        assert_eq!(t400.to_f64(), Err(IntError::Overflow));
        // float(2**1024 - 1) rounds up to 2**1024: OverflowError in Python
        let m = big("2").pow(&big("1024")).unwrap().sub(&big("1")).unwrap();
        assert_eq!(m.to_f64(), Err(IntError::Overflow));
        // float(2**1024 - 2**970 - 1) = max double
        let m = big("2")
            .pow(&big("1024"))
            .unwrap()
            .sub(&big("2").pow(&big("970")).unwrap())
            .unwrap()
            .sub(&big("1"))
            .unwrap();
        assert_eq!(m.to_f64(), Ok(f64::MAX));
        // (2**200 + 1) / 3 rounded: 5.356460147529967e+59
        let n = a.add(&big("1")).unwrap();
        assert_eq!(n.truediv(&big("3")), Ok(5.356460147529967e59));
        // a subnormal: 3 / 2**1075 == 5e-324 (ties to even, 1.5 ulp -> 2 ulp)
        let d = big("2").pow(&big("1075")).unwrap();
        assert_eq!(big("3").truediv(&d), Ok(1e-323));
        assert_eq!(big("1").truediv(&d), Ok(0.0));
        // 10**30 / 7 (both beyond 2**53): 1.4285714285714285e+29
        let x = big("1000000000000000000000000000000");
        assert_eq!(x.truediv(&big("7")), Ok(1.4285714285714285e29));
    }

    #[test]
    fn limits() {
        assert_eq!(big("9").pow(&big("100000")), Err(IntError::TooLarge));
        assert_eq!(
            big("1").pow(&big("99999999999999999999999999999999999999999")),
            Ok(Int::Small(1))
        );
        assert_eq!(big("-1").pow(&big("3")), Ok(Int::Small(-1)));
        assert_eq!(big("0").pow(&big("0")), Ok(Int::Small(1)));
        assert_eq!(big("5").floordiv(&big("0")), Err(IntError::ZeroDivision));
        assert_eq!(big("5").truediv(&big("0")), Err(IntError::ZeroDivision));
    }

    #[test]
    fn literals() {
        assert_eq!(Int::from_decimal("007"), Some(Int::Small(7)));
        assert_eq!(Int::from_decimal(""), None);
        assert_eq!(Int::from_decimal("1_000"), None);
        assert_eq!(Int::from_decimal("-1"), None);
        let d = "1".repeat(60);
        assert_eq!(to_dec(&Int::from_decimal(&d).unwrap()), d);
        // 2**127 is the first positive value past the fast path; -(2**127) is back on it
        let p = big("2").pow(&big("127")).unwrap();
        assert!(matches!(p, Int::Big(_)));
        assert_eq!(p.neg(), Ok(Int::Small(i128::MIN)));
        assert_eq!(
            Int::Small(i128::MIN).truediv(&big("2")),
            Ok(-(2f64.powi(126)))
        );
    }

    fn arb_int() -> impl Strategy<Value = i128> {
        prop_oneof![
            -1000i128..1000,
            any::<i64>().prop_map(|v| v as i128),
            any::<i128>().prop_map(|v| v >> 8),
        ]
    }

    proptest! {
        // The big path (forced by holding small values as `Big`) agrees with i128 arithmetic
        // wherever i128 is exact: Python's floor division and the correctly rounded quotient.
        #[test]
        fn big_path_matches_i128(a in arb_int(), b in arb_int()) {
            let (ba, bb) = (Int::Big(BigInt::from(a)), Int::Big(BigInt::from(b)));
            prop_assert_eq!(ba.add(&bb).ok().and_then(|v| v.as_i128()), a.checked_add(b));
            if let Some(p) = a.checked_mul(b) {
                prop_assert_eq!(ba.mul(&bb), Ok(Int::Small(p)));
            }
            if b != 0 {
                let eq = a.div_euclid(b);
                // floor from euclid: for b < 0 and a nonzero remainder the floor is one less
                let fq = if b < 0 && a.rem_euclid(b) != 0 { eq - 1 } else { eq };
                prop_assert_eq!(ba.floordiv(&bb), Ok(Int::Small(fq)));
                prop_assert_eq!(Int::Small(a).floordiv(&Int::Small(b)), Ok(Int::Small(fq)));
                let small = Int::Small(a).truediv(&Int::Small(b)).unwrap();
                prop_assert_eq!(Ok(small), ba.truediv(&bb));
            }
            prop_assert_eq!(ba.to_f64(), Ok(a as f64));
        }
    }
}
