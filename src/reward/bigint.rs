//! Arbitrary-precision integers, just enough to evaluate countdown equations with Python's integer
//! semantics (TinyZero `eval`s them, and Python integers never overflow).
//!
//! Design: [`Int`] keeps values that fit in an `i128` inline (every realistic countdown equation
//! stays there, so the fast path allocates nothing) and promotes to a sign-magnitude [`BigInt`]
//! with little-endian `u32` limbs when a checked `i128` operation overflows. Division is Knuth's
//! algorithm D (Hacker's Delight `divmnu`). Conversions to `f64` round to nearest, ties to even,
//! exactly as CPython's `int.__float__` and `int / int` (`long_true_divide`) do, including
//! subnormal results and the `OverflowError` when the result does not fit a double.
//!
//! Bound: no value may exceed [`MAX_BITS`] bits (about 19,700 decimal digits). Python would go on
//! computing (or run out of memory on `9**9**9**9`); here such an operation fails with
//! [`IntError::TooLarge`], which the evaluator maps to "not evaluable", the same outcome as any
//! Python exception. A countdown equation can only use the given numbers once each, so a result
//! that large cannot come back to a small target except by an equally large operation.
use std::cmp::Ordering;

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

/// Sign-magnitude big integer; `mag` is little-endian base 2^32 without trailing zero limbs;
/// zero is an empty `mag` with `neg == false`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BigInt {
    neg: bool,
    mag: Vec<u32>,
}

/// A Python `int`: inline when it fits in an `i128`, big otherwise (never both for one value).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Int {
    Small(i128),
    Big(BigInt),
}

// ---------------------------------------------------------------------------------------------
// magnitude helpers (little-endian u32 limbs)

fn trim(v: &mut Vec<u32>) {
    while v.last() == Some(&0) {
        v.pop();
    }
}

fn mag_from_u128(mut x: u128) -> Vec<u32> {
    let mut v = Vec::with_capacity(4);
    while x != 0 {
        v.push(x as u32);
        x >>= 32;
    }
    v
}

fn mag_bits(a: &[u32]) -> u64 {
    match a.last() {
        None => 0,
        Some(&top) => (a.len() as u64 - 1) * 32 + (32 - top.leading_zeros() as u64),
    }
}

fn mag_cmp(a: &[u32], b: &[u32]) -> Ordering {
    if a.len() != b.len() {
        return a.len().cmp(&b.len());
    }
    for i in (0..a.len()).rev() {
        match a[i].cmp(&b[i]) {
            Ordering::Equal => continue,
            o => return o,
        }
    }
    Ordering::Equal
}

fn mag_add(a: &[u32], b: &[u32]) -> Vec<u32> {
    let (long, short) = if a.len() >= b.len() { (a, b) } else { (b, a) };
    let mut out = Vec::with_capacity(long.len() + 1);
    let mut carry = 0u64;
    for (i, &l) in long.iter().enumerate() {
        let s = l as u64 + short.get(i).copied().unwrap_or(0) as u64 + carry;
        out.push(s as u32);
        carry = s >> 32;
    }
    if carry != 0 {
        out.push(carry as u32);
    }
    out
}

/// `a - b` for `a >= b`.
fn mag_sub(a: &[u32], b: &[u32]) -> Vec<u32> {
    let mut out = Vec::with_capacity(a.len());
    let mut borrow = 0i64;
    for (i, &x) in a.iter().enumerate() {
        let d = x as i64 - b.get(i).copied().unwrap_or(0) as i64 - borrow;
        if d < 0 {
            out.push((d + (1i64 << 32)) as u32);
            borrow = 1;
        } else {
            out.push(d as u32);
            borrow = 0;
        }
    }
    trim(&mut out);
    out
}

fn mag_mul(a: &[u32], b: &[u32]) -> Vec<u32> {
    if a.is_empty() || b.is_empty() {
        return Vec::new();
    }
    let mut out = vec![0u32; a.len() + b.len()];
    for (i, &x) in a.iter().enumerate() {
        let mut carry = 0u64;
        for (j, &y) in b.iter().enumerate() {
            let t = x as u64 * y as u64 + out[i + j] as u64 + carry;
            out[i + j] = t as u32;
            carry = t >> 32;
        }
        out[i + b.len()] = carry as u32;
    }
    trim(&mut out);
    out
}

fn mag_shl(a: &[u32], s: u32) -> Vec<u32> {
    // s < 32
    if s == 0 {
        return a.to_vec();
    }
    let mut out = Vec::with_capacity(a.len() + 1);
    let mut carry = 0u32;
    for &x in a {
        out.push((x << s) | carry);
        carry = x >> (32 - s);
    }
    out.push(carry);
    trim(&mut out);
    out
}

/// Shift left by any number of bits.
fn mag_shl_bits(a: &[u32], bits: u64) -> Vec<u32> {
    if a.is_empty() {
        return Vec::new();
    }
    let limbs = (bits / 32) as usize;
    let mut out = vec![0u32; limbs];
    out.extend_from_slice(&mag_shl(a, (bits % 32) as u32));
    trim(&mut out);
    out
}

/// Quotient and remainder of magnitudes, `b` nonzero (Knuth D, Hacker's Delight `divmnu`).
fn mag_divmod(u: &[u32], v: &[u32]) -> (Vec<u32>, Vec<u32>) {
    debug_assert!(!v.is_empty());
    if mag_cmp(u, v) == Ordering::Less {
        return (Vec::new(), u.to_vec());
    }
    let n = v.len();
    if n == 1 {
        let d = v[0] as u64;
        let mut q = vec![0u32; u.len()];
        let mut r = 0u64;
        for i in (0..u.len()).rev() {
            let cur = (r << 32) | u[i] as u64;
            q[i] = (cur / d) as u32;
            r = cur % d;
        }
        trim(&mut q);
        let mut rv = vec![r as u32];
        trim(&mut rv);
        return (q, rv);
    }
    let m = u.len() - n;
    let s = v[n - 1].leading_zeros();
    let vn: Vec<u32> = {
        let mut t = mag_shl(v, s);
        t.resize(n, 0);
        t
    };
    let mut un: Vec<u32> = {
        let mut t = mag_shl(u, s);
        t.resize(u.len() + 1, 0);
        t
    };
    let b: u64 = 1 << 32;
    let mut q = vec![0u32; m + 1];
    for j in (0..=m).rev() {
        let num = ((un[j + n] as u64) << 32) | un[j + n - 1] as u64;
        let mut qhat = num / vn[n - 1] as u64;
        let mut rhat = num % vn[n - 1] as u64;
        while qhat >= b || qhat * vn[n - 2] as u64 > ((rhat << 32) | un[j + n - 2] as u64) {
            qhat -= 1;
            rhat += vn[n - 1] as u64;
            if rhat >= b {
                break;
            }
        }
        // multiply and subtract
        let mut k: i64 = 0;
        for i in 0..n {
            let p = qhat * vn[i] as u64;
            let t = un[i + j] as i64 - k - (p & 0xFFFF_FFFF) as i64;
            un[i + j] = t as u32;
            k = (p >> 32) as i64 - (t >> 32);
        }
        let t = un[j + n] as i64 - k;
        un[j + n] = t as u32;
        if t < 0 {
            q[j] = (qhat - 1) as u32;
            let mut k2 = 0u64;
            for i in 0..n {
                let t2 = un[i + j] as u64 + vn[i] as u64 + k2;
                un[i + j] = t2 as u32;
                k2 = t2 >> 32;
            }
            un[j + n] = un[j + n].wrapping_add(k2 as u32);
        } else {
            q[j] = qhat as u32;
        }
    }
    trim(&mut q);
    // remainder: un[0..n] >> s
    let mut r = vec![0u32; n];
    for i in 0..n {
        r[i] = if s == 0 {
            un[i]
        } else {
            (un[i] >> s) | (un[i + 1] << (32 - s))
        };
    }
    trim(&mut r);
    (q, r)
}

/// Top 64 bits of a magnitude (as an integer < 2^64), the exponent to scale them back and
/// whether any lower bit was set.
fn mag_top64(a: &[u32]) -> (u64, i64, bool) {
    let bits = mag_bits(a);
    if bits <= 64 {
        let mut x = 0u64;
        for (i, &l) in a.iter().enumerate() {
            x |= (l as u64) << (32 * i);
        }
        return (x, 0, false);
    }
    let shift = bits - 64;
    let limb = (shift / 32) as usize;
    let off = (shift % 32) as u32;
    let mut acc: u128 = 0;
    for i in (limb..a.len())
        .rev()
        .take(3)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
    {
        acc |= (a[i] as u128) << (32 * (i - limb));
    }
    let top = (acc >> off) as u64;
    let sticky =
        a[..limb].iter().any(|&l| l != 0) || (off > 0 && (a[limb] & ((1u32 << off) - 1)) != 0);
    (top, shift as i64, sticky)
}

/// Correctly rounded `(m + delta) * 2^e` where `delta` in (0,1) iff `sticky`, to nearest, ties to
/// even, with subnormals. Needs `m` to carry at least two bits beyond the 53 kept when `sticky`
/// (callers pass 55+ bits). `Err(Overflow)` when the result is not finite.
pub(crate) fn round_to_f64(m: u64, sticky: bool, e: i64) -> Result<f64, IntError> {
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

impl BigInt {
    fn from_parts(neg: bool, mut mag: Vec<u32>) -> BigInt {
        trim(&mut mag);
        let neg = neg && !mag.is_empty();
        BigInt { neg, mag }
    }

    pub fn from_i128(v: i128) -> BigInt {
        BigInt::from_parts(v < 0, mag_from_u128(v.unsigned_abs()))
    }

    pub fn is_zero(&self) -> bool {
        self.mag.is_empty()
    }

    pub fn is_negative(&self) -> bool {
        self.neg
    }

    /// Bit length of the magnitude.
    pub fn bits(&self) -> u64 {
        mag_bits(&self.mag)
    }

    pub fn to_i128(&self) -> Option<i128> {
        if self.mag.len() > 4 {
            return None;
        }
        let mut m: u128 = 0;
        for (i, &l) in self.mag.iter().enumerate() {
            m |= (l as u128) << (32 * i);
        }
        if self.neg {
            if m <= i128::MAX as u128 + 1 {
                Some((m as i128).wrapping_neg())
            } else {
                None
            }
        } else if m <= i128::MAX as u128 {
            Some(m as i128)
        } else {
            None
        }
    }

    fn neg(&self) -> BigInt {
        BigInt::from_parts(!self.neg, self.mag.clone())
    }

    fn add(&self, o: &BigInt) -> BigInt {
        if self.neg == o.neg {
            return BigInt::from_parts(self.neg, mag_add(&self.mag, &o.mag));
        }
        match mag_cmp(&self.mag, &o.mag) {
            Ordering::Equal => BigInt::from_parts(false, Vec::new()),
            Ordering::Greater => BigInt::from_parts(self.neg, mag_sub(&self.mag, &o.mag)),
            Ordering::Less => BigInt::from_parts(o.neg, mag_sub(&o.mag, &self.mag)),
        }
    }

    fn mul(&self, o: &BigInt) -> BigInt {
        BigInt::from_parts(self.neg != o.neg, mag_mul(&self.mag, &o.mag))
    }

    /// Floor division and modulo (Python `divmod`), `o` nonzero.
    fn divmod_floor(&self, o: &BigInt) -> (BigInt, BigInt) {
        let (q, r) = mag_divmod(&self.mag, &o.mag);
        let mut q = BigInt::from_parts(self.neg != o.neg, q);
        let mut r = BigInt::from_parts(self.neg, r);
        if !r.is_zero() && (self.neg != o.neg) {
            q = q.add(&BigInt::from_i128(-1));
            r = r.add(o);
        }
        (q, r)
    }

    /// Nearest double, ties to even; `Err(Overflow)` beyond the double range.
    fn to_f64(&self) -> Result<f64, IntError> {
        let (top, e, sticky) = mag_top64(&self.mag);
        let v = round_to_f64(top, sticky, e)?;
        Ok(if self.neg { -v } else { v })
    }

    /// Decimal digits (ASCII, no sign) to an integer.
    pub fn from_decimal(digits: &str) -> BigInt {
        let mut mag: Vec<u32> = Vec::new();
        for chunk in digits.as_bytes().chunks(9) {
            let mut mulv = 1u64;
            let mut addv = 0u64;
            for &c in chunk {
                mulv *= 10;
                addv = addv * 10 + (c - b'0') as u64;
            }
            let mut carry = addv;
            for l in mag.iter_mut() {
                let t = *l as u64 * mulv + carry;
                *l = t as u32;
                carry = t >> 32;
            }
            while carry != 0 {
                mag.push(carry as u32);
                carry >>= 32;
            }
        }
        BigInt::from_parts(false, mag)
    }
}

impl Int {
    fn from_big(b: BigInt) -> Int {
        match b.to_i128() {
            Some(v) => Int::Small(v),
            None => Int::Big(b),
        }
    }

    fn to_big(&self) -> BigInt {
        match self {
            Int::Small(v) => BigInt::from_i128(*v),
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

    /// A decimal literal (ASCII digits, leading zeros allowed here; the tokenizer enforces
    /// Python's literal rules).
    pub fn from_decimal(digits: &str) -> Int {
        if digits.len() <= 38 {
            // ok: at most 38 ASCII digits always fit an i128
            if let Ok(v) = digits.parse::<i128>() {
                return Int::Small(v);
            }
        }
        Int::from_big(BigInt::from_decimal(digits))
    }

    pub fn is_zero(&self) -> bool {
        matches!(self, Int::Small(0))
    }

    pub fn is_negative(&self) -> bool {
        match self {
            Int::Small(v) => *v < 0,
            Int::Big(b) => b.is_negative(),
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
                None => Int::Big(BigInt::from_i128(*v).neg()),
            }),
            Int::Big(b) => Ok(Int::from_big(b.neg())),
        }
    }

    pub fn add(&self, o: &Int) -> Result<Int, IntError> {
        if let (Int::Small(a), Int::Small(b)) = (self, o) {
            if let Some(s) = a.checked_add(*b) {
                return Ok(Int::Small(s));
            }
        }
        Int::checked(self.to_big().add(&o.to_big()))
    }

    pub fn sub(&self, o: &Int) -> Result<Int, IntError> {
        if let (Int::Small(a), Int::Small(b)) = (self, o) {
            if let Some(s) = a.checked_sub(*b) {
                return Ok(Int::Small(s));
            }
        }
        Int::checked(self.to_big().add(&o.to_big().neg()))
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
        Int::checked(a.mul(&b))
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
        Ok(Int::from_big(self.to_big().divmod_floor(&o.to_big()).0))
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
                    Int::Big(b) => b.mag.first().is_some_and(|l| l & 1 == 1),
                };
                return Ok(Int::Small(if odd { -1 } else { 1 }));
            }
            _ => {}
        }
        let exp = match e.as_i128() {
            Some(v) if v <= MAX_BITS as i128 => v as u64,
            _ => return Err(IntError::TooLarge),
        };
        let base_bits = match self {
            Int::Small(v) => 128 - v.unsigned_abs().leading_zeros() as u64,
            Int::Big(b) => b.bits(),
        };
        // |base| >= 2 here, so the result has at least (base_bits - 1) * exp + 1 bits
        if exp > 0 && (base_bits - 1) * exp + 1 > MAX_BITS {
            return Err(IntError::TooLarge);
        }
        let mut result = Int::Small(1);
        let mut base = self.clone();
        let mut k = exp;
        while k > 0 {
            if k & 1 == 1 {
                result = result.mul(&base)?;
            }
            k >>= 1;
            if k > 0 {
                base = base.mul(&base)?;
            }
        }
        Ok(result)
    }

    /// Python `float(a)`: nearest double, ties to even; `Err(Overflow)` beyond the double range.
    pub fn to_f64(&self) -> Result<f64, IntError> {
        match self {
            Int::Small(v) => Ok(*v as f64),
            Int::Big(b) => b.to_f64(),
        }
    }

    /// Python `a / b` on integers (`long_true_divide`): the correctly rounded quotient.
    pub fn truediv(&self, o: &Int) -> Result<f64, IntError> {
        if o.is_zero() {
            return Err(IntError::ZeroDivision);
        }
        const EXACT: i128 = 1 << 53;
        if let (Int::Small(a), Int::Small(b)) = (self, o) {
            if a.abs() <= EXACT && b.abs() <= EXACT {
                return Ok(*a as f64 / *b as f64);
            }
        }
        let (a, b) = (self.to_big(), o.to_big());
        let neg = a.neg != b.neg;
        if a.is_zero() {
            return Ok(if neg { -0.0 } else { 0.0 });
        }
        let (na, nb) = (a.bits() as i64, b.bits() as i64);
        let e0 = na - nb; // 2^(e0-1) < |a/b| < 2^(e0+1)
        if e0 > 1025 {
            return Err(IntError::Overflow);
        }
        if e0 < -1080 {
            return Ok(if neg { -0.0 } else { 0.0 });
        }
        // q = floor(|a| 2^k / |b|) has 55 or 56 bits
        let k = 55 - e0;
        let (num, den) = if k >= 0 {
            (mag_shl_bits(&a.mag, k as u64), b.mag.clone())
        } else {
            (a.mag.clone(), mag_shl_bits(&b.mag, (-k) as u64))
        };
        let (q, r) = mag_divmod(&num, &den);
        let (top, e, sticky_q) = mag_top64(&q);
        let v = round_to_f64(top, sticky_q || !r.is_empty(), e - k)?;
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
        let v = Int::from_decimal(d);
        if neg {
            v.neg().unwrap()
        } else {
            v
        }
    }

    /// Decimal rendering, for tests only (slow).
    fn to_dec(v: &Int) -> String {
        let b = v.to_big();
        if b.is_zero() {
            return "0".into();
        }
        let mut mag = b.mag.clone();
        let mut digits = Vec::new();
        while !mag.is_empty() {
            let (q, r) = mag_divmod(&mag, &[10]);
            digits.push(b'0' + r.first().copied().unwrap_or(0) as u8);
            mag = q;
        }
        if b.neg {
            digits.push(b'-');
        }
        digits.reverse();
        String::from_utf8(digits).unwrap()
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

    fn arb_int() -> impl Strategy<Value = i128> {
        prop_oneof![
            -1000i128..1000,
            any::<i64>().prop_map(|v| v as i128),
            any::<i128>().prop_map(|v| v >> 8),
        ]
    }

    proptest! {
        // The big path agrees with i128 arithmetic wherever i128 is exact.
        #[test]
        fn big_path_matches_i128(a in arb_int(), b in arb_int()) {
            let (ba, bb) = (BigInt::from_i128(a), BigInt::from_i128(b));
            prop_assert_eq!(ba.add(&bb).to_i128(), a.checked_add(b));
            if let Some(p) = a.checked_mul(b) {
                prop_assert_eq!(ba.mul(&bb).to_i128(), Some(p));
            }
            if b != 0 {
                let (q, r) = ba.divmod_floor(&bb);
                let eq = a.div_euclid(b);
                // floor from euclid: a = b*eq + r with 0 <= r < |b|; for b < 0 and r != 0 the
                // floor quotient is one less (remainder r + b, with the sign of b)
                let fq = if b < 0 && a.rem_euclid(b) != 0 { eq - 1 } else { eq };
                let fr = a - fq * b;
                prop_assert_eq!(q.to_i128(), Some(fq));
                prop_assert_eq!(r.to_i128(), Some(fr));
                let small = Int::Small(a).truediv(&Int::Small(b)).unwrap();
                let viabig = Int::Big(ba.clone()).truediv(&Int::Big(bb.clone()));
                prop_assert_eq!(Ok(small), viabig);
            }
            prop_assert_eq!(ba.to_f64(), Ok(a as f64));
        }

        // Multi-limb division: (q*d + r) / d gives back q and r.
        #[test]
        fn divmod_roundtrip(q in any::<u128>(), d in 1u128.., r0 in any::<u128>(), hi in any::<u64>()) {
            let d = BigInt::from_parts(false, { let mut m = mag_from_u128(d); m.extend(mag_from_u128(hi as u128)); m });
            let q = BigInt::from_i128((q >> 1) as i128);
            let r = BigInt::from_parts(false, mag_divmod(&mag_from_u128(r0), &d.mag).1);
            let n = q.mul(&d).add(&r);
            let (q2, r2) = n.divmod_floor(&d);
            prop_assert_eq!(q2, q);
            prop_assert_eq!(r2, r);
        }
    }
}
