//! A Python 3 arithmetic evaluator for the strings TinyZero's countdown verifier passes to `eval`
//! (our own parser: nothing is ever executed).
//!
//! TinyZero accepts an equation when it fully matches `^[\d+\-*/().\s]+$` and `eval` returns
//! without raising; every exception becomes "no value". This module reproduces what CPython 3.11
//! does on that character set:
//! - tokens: integer literals (arbitrary size; leading zeros only for an all-zero literal; at most
//!   4300 digits, CPython's `int_max_str_digits`), float literals (`1.`, `.5`, `007.5`), `+ - * /
//!   // **`, parentheses; whitespace is space, tab and form feed; `\r` is a newline, ignored
//!   inside parentheses and a syntax error outside; anything else (non-ASCII digits or spaces
//!   that the regex lets through, `\v`, `...`) is a syntax error, as in CPython;
//! - grammar and precedence of Python: `**` binds tighter than a unary sign on its left and is
//!   right-associative, its right operand may carry signs (`2**-1`), `-2**2 == -4`; `()` is the
//!   empty tuple and calling a value (`2(3)`) is a `TypeError`, both "no value";
//! - numbers: `int` (exact, see [`super::bigint`]), `float`, and `complex`, which appears when a
//!   negative float is raised to a non-integer power (`(1-2)**(1/2)`); each operation follows
//!   CPython's C code (`float_pow`'s special cases, `float_floor_div` via `fmod`, `int / int`
//!   correctly rounded, `complex_pow` with repeated squaring for integral exponents up to 100,
//!   `OverflowError` when an int does not fit a double, `ZeroDivisionError` ...);
//! - limits: 200 nested parentheses, as CPython's tokenizer; expressions nested deeper than 2991
//!   levels (CPython 3.11 raises `RecursionError` while compiling around there; the exact figure
//!   varies by a few levels with the construct and by Python version); integers beyond
//!   [`super::bigint::MAX_BITS`] bits.
//!
//! The parser is recursive only through parentheses (at most 200 frames); chains of signs,
//! powers and binary operators are parsed iteratively, so no input can exhaust the stack, and
//! values are computed while parsing. A syntax error found after an evaluation error changes
//! nothing: both are "no value".
use super::bigint::{Int, IntError};

/// A Python number.
#[derive(Clone, Debug, PartialEq)]
pub enum PyNum {
    Int(Int),
    Float(f64),
    Complex(f64, f64),
}

/// Why an expression has no value (the Python exception it would raise).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PyError {
    Syntax,
    ZeroDivision,
    Overflow,
    Type,
    /// Beyond our integer size bound (Python would keep computing).
    TooLarge,
    /// Nested too deeply (`SyntaxError` / `RecursionError` in CPython).
    TooDeep,
}

impl From<IntError> for PyError {
    fn from(e: IntError) -> PyError {
        match e {
            IntError::ZeroDivision => PyError::ZeroDivision,
            IntError::Overflow => PyError::Overflow,
            IntError::TooLarge => PyError::TooLarge,
        }
    }
}

type R<T> = Result<T, PyError>;

/// CPython's tokenizer limit on nested parentheses.
pub const MAX_PAREN_DEPTH: usize = 200;
/// Approximate CPython 3.11 limit on expression nesting (see the module docs).
pub const MAX_AST_DEPTH: u32 = 2991;
/// CPython 3.11's default `sys.get_int_max_str_digits()`.
pub const MAX_INT_DIGITS: usize = 4300;

// ---------------------------------------------------------------------------------------------
// arithmetic

fn as_f64(v: &PyNum) -> R<f64> {
    match v {
        PyNum::Int(i) => Ok(i.to_f64()?),
        PyNum::Float(f) => Ok(*f),
        PyNum::Complex(..) => Err(PyError::Type),
    }
}

fn as_complex(v: &PyNum) -> R<(f64, f64)> {
    match v {
        PyNum::Complex(r, i) => Ok((*r, *i)),
        other => Ok((as_f64(other)?, 0.0)),
    }
}

fn is_complex(a: &PyNum, b: &PyNum) -> bool {
    matches!(a, PyNum::Complex(..)) || matches!(b, PyNum::Complex(..))
}

fn int_op(r: Result<Int, IntError>) -> R<PyNum> {
    Ok(PyNum::Int(r?))
}

pub fn add(a: &PyNum, b: &PyNum) -> R<PyNum> {
    if let (PyNum::Int(x), PyNum::Int(y)) = (a, b) {
        return int_op(x.add(y));
    }
    if is_complex(a, b) {
        let ((ar, ai), (br, bi)) = (as_complex(a)?, as_complex(b)?);
        return Ok(PyNum::Complex(ar + br, ai + bi));
    }
    Ok(PyNum::Float(as_f64(a)? + as_f64(b)?))
}

pub fn sub(a: &PyNum, b: &PyNum) -> R<PyNum> {
    if let (PyNum::Int(x), PyNum::Int(y)) = (a, b) {
        return int_op(x.sub(y));
    }
    if is_complex(a, b) {
        let ((ar, ai), (br, bi)) = (as_complex(a)?, as_complex(b)?);
        return Ok(PyNum::Complex(ar - br, ai - bi));
    }
    Ok(PyNum::Float(as_f64(a)? - as_f64(b)?))
}

fn c_prod(a: (f64, f64), b: (f64, f64)) -> (f64, f64) {
    (a.0 * b.0 - a.1 * b.1, a.0 * b.1 + a.1 * b.0)
}

/// CPython `_Py_c_quot`; `None` is `EDOM` (division by zero).
fn c_quot(a: (f64, f64), b: (f64, f64)) -> Option<(f64, f64)> {
    let abs_br = b.0.abs();
    let abs_bi = b.1.abs();
    if abs_br >= abs_bi {
        if abs_br == 0.0 {
            None
        } else {
            let ratio = b.1 / b.0;
            let denom = b.0 + b.1 * ratio;
            Some(((a.0 + a.1 * ratio) / denom, (a.1 - a.0 * ratio) / denom))
        }
    } else if abs_bi >= abs_br {
        let ratio = b.0 / b.1;
        let denom = b.0 * ratio + b.1;
        Some(((a.0 * ratio + a.1) / denom, (a.1 * ratio - a.0) / denom))
    } else {
        Some((f64::NAN, f64::NAN))
    }
}

pub fn mul(a: &PyNum, b: &PyNum) -> R<PyNum> {
    if let (PyNum::Int(x), PyNum::Int(y)) = (a, b) {
        return int_op(x.mul(y));
    }
    if is_complex(a, b) {
        let (r, i) = c_prod(as_complex(a)?, as_complex(b)?);
        return Ok(PyNum::Complex(r, i));
    }
    Ok(PyNum::Float(as_f64(a)? * as_f64(b)?))
}

pub fn truediv(a: &PyNum, b: &PyNum) -> R<PyNum> {
    if let (PyNum::Int(x), PyNum::Int(y)) = (a, b) {
        return Ok(PyNum::Float(x.truediv(y)?));
    }
    if is_complex(a, b) {
        return match c_quot(as_complex(a)?, as_complex(b)?) {
            Some((r, i)) => Ok(PyNum::Complex(r, i)),
            None => Err(PyError::ZeroDivision),
        };
    }
    let (x, y) = (as_f64(a)?, as_f64(b)?);
    if y == 0.0 {
        return Err(PyError::ZeroDivision);
    }
    Ok(PyNum::Float(x / y))
}

/// CPython `_float_div_mod`'s quotient (`float.__floordiv__`).
fn float_floordiv(vx: f64, wx: f64) -> R<f64> {
    if wx == 0.0 {
        return Err(PyError::ZeroDivision);
    }
    let mut m = vx % wx;
    let mut div = (vx - m) / wx;
    if m != 0.0 {
        if (wx < 0.0) != (m < 0.0) {
            m += wx;
            div -= 1.0;
        }
    } else {
        m = 0.0f64.copysign(wx);
    }
    let _ = m;
    if div != 0.0 {
        let mut fl = div.floor();
        if div - fl > 0.5 {
            fl += 1.0;
        }
        Ok(fl)
    } else {
        Ok(0.0f64.copysign(vx / wx))
    }
}

pub fn floordiv(a: &PyNum, b: &PyNum) -> R<PyNum> {
    if let (PyNum::Int(x), PyNum::Int(y)) = (a, b) {
        return int_op(x.floordiv(y));
    }
    if is_complex(a, b) {
        return Err(PyError::Type);
    }
    Ok(PyNum::Float(float_floordiv(as_f64(a)?, as_f64(b)?)?))
}

fn is_odd_integer(x: f64) -> bool {
    x.abs() % 2.0 == 1.0
}

/// CPython 3.11 `float_pow` (both operands already doubles).
fn float_pow(iv: f64, iw: f64) -> R<PyNum> {
    if iw == 0.0 {
        return Ok(PyNum::Float(1.0));
    }
    if iv.is_nan() {
        return Ok(PyNum::Float(iv));
    }
    if iw.is_nan() {
        return Ok(PyNum::Float(if iv == 1.0 { 1.0 } else { iw }));
    }
    if iw.is_infinite() {
        let a = iv.abs();
        return Ok(PyNum::Float(if a == 1.0 {
            1.0
        } else if (iw > 0.0) == (a > 1.0) {
            iw.abs()
        } else {
            0.0
        }));
    }
    if iv.is_infinite() {
        let odd = is_odd_integer(iw);
        return Ok(PyNum::Float(if iw > 0.0 {
            if odd {
                iv
            } else {
                iv.abs()
            }
        } else if odd {
            0.0f64.copysign(iv)
        } else {
            0.0
        }));
    }
    if iv == 0.0 {
        let odd = is_odd_integer(iw);
        if iw < 0.0 {
            return Err(PyError::ZeroDivision);
        }
        return Ok(PyNum::Float(if odd { iv } else { 0.0 }));
    }
    let mut iv = iv;
    let mut negate = false;
    if iv < 0.0 {
        if iw != iw.floor() {
            // negative base, fractional exponent: complex result
            return complex_pow((iv, 0.0), (iw, 0.0));
        }
        iv = -iv;
        negate = is_odd_integer(iw);
    }
    if iv == 1.0 {
        return Ok(PyNum::Float(if negate { -1.0 } else { 1.0 }));
    }
    let ix = iv.powf(iw);
    if ix.is_infinite() {
        return Err(PyError::Overflow);
    }
    Ok(PyNum::Float(if negate { -ix } else { ix }))
}

fn c_powu(x: (f64, f64), n: i64) -> (f64, f64) {
    let mut r = (1.0, 0.0);
    let mut p = x;
    let mut mask: i64 = 1;
    while mask > 0 && n >= mask {
        if n & mask != 0 {
            r = c_prod(r, p);
        }
        mask <<= 1;
        p = c_prod(p, p);
    }
    r
}

/// CPython `_Py_c_pow`; `Err` is `EDOM`.
fn c_pow(a: (f64, f64), b: (f64, f64)) -> Result<(f64, f64), ()> {
    if b.0 == 0.0 && b.1 == 0.0 {
        return Ok((1.0, 0.0));
    }
    if a.0 == 0.0 && a.1 == 0.0 {
        if b.1 != 0.0 || b.0 < 0.0 {
            return Err(());
        }
        return Ok((0.0, 0.0));
    }
    let vabs = a.0.hypot(a.1);
    let mut len = vabs.powf(b.0);
    let at = a.1.atan2(a.0);
    let mut phase = at * b.0;
    if b.1 != 0.0 {
        len /= (at * b.1).exp();
        phase += b.1 * vabs.ln();
    }
    Ok((len * phase.cos(), len * phase.sin()))
}

/// CPython 3.11 `complex_pow`.
fn complex_pow(a: (f64, f64), b: (f64, f64)) -> R<PyNum> {
    let p = if b.1 == 0.0 && b.0 == b.0.floor() && b.0.abs() <= 100.0 {
        let n = b.0 as i64;
        if n > 0 {
            Ok(c_powu(a, n))
        } else {
            c_quot((1.0, 0.0), c_powu(a, -n)).ok_or(())
        }
    } else {
        c_pow(a, b)
    };
    match p {
        Err(()) => Err(PyError::ZeroDivision),
        Ok((r, i)) if r.is_infinite() || i.is_infinite() => Err(PyError::Overflow),
        Ok((r, i)) => Ok(PyNum::Complex(r, i)),
    }
}

pub fn pow(a: &PyNum, b: &PyNum) -> R<PyNum> {
    if let (PyNum::Int(x), PyNum::Int(y)) = (a, b) {
        if !y.is_negative() {
            return int_op(x.pow(y));
        }
        return float_pow(x.to_f64()?, y.to_f64()?);
    }
    if is_complex(a, b) {
        return complex_pow(as_complex(a)?, as_complex(b)?);
    }
    float_pow(as_f64(a)?, as_f64(b)?)
}

pub fn neg(a: &PyNum) -> R<PyNum> {
    match a {
        PyNum::Int(i) => int_op(i.neg()),
        PyNum::Float(f) => Ok(PyNum::Float(-f)),
        PyNum::Complex(r, i) => Ok(PyNum::Complex(-r, -i)),
    }
}

/// Python `abs(result - target) < 1e-5`, the final test of TinyZero's `compute_score`;
/// `false` also when Python would raise (the caller scores that as a wrong answer too).
pub fn close_to(result: &PyNum, target: &PyNum) -> bool {
    let diff = match sub(result, target) {
        Ok(d) => d,
        Err(_) => return false,
    };
    match diff {
        PyNum::Int(i) => i.is_zero(),
        PyNum::Float(f) => f.abs() < 1e-5,
        PyNum::Complex(r, i) => r.hypot(i) < 1e-5,
    }
}

// ---------------------------------------------------------------------------------------------
// tokens and parser

#[derive(Debug, Clone, Copy, PartialEq)]
enum Tok<'a> {
    Int(&'a str),
    Float(&'a str),
    Plus,
    Minus,
    Star,
    DStar,
    Slash,
    DSlash,
    LPar,
    RPar,
}

fn tokenize(s: &str) -> R<Vec<Tok<'_>>> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(16);
    let mut i = leading_blank(b)?;
    let mut level: i64 = 0;
    while i < b.len() {
        let c = b[i];
        match c {
            b' ' | b'\t' | 0x0c => i += 1,
            b'\r' | b'\n' => {
                if level > 0 {
                    i += 1
                } else {
                    // a top-level newline ends the expression: only blank lines may follow
                    if trailing_lines_blank(&s[i..]) {
                        break;
                    }
                    return Err(PyError::Syntax);
                }
            }
            b'0'..=b'9' | b'.' => {
                let start = i;
                while i < b.len() && b[i].is_ascii_digit() {
                    i += 1;
                }
                let int_end = i;
                if i < b.len() && b[i] == b'.' {
                    i += 1;
                    let frac_start = i;
                    while i < b.len() && b[i].is_ascii_digit() {
                        i += 1;
                    }
                    if int_end == start && i == frac_start {
                        // a lone '.' (or the start of '...'): not an expression we can value
                        return Err(PyError::Syntax);
                    }
                    out.push(Tok::Float(&s[start..i]));
                } else {
                    let lit = &s[start..int_end];
                    if lit.len() > 1 && lit.starts_with('0') && lit.bytes().any(|d| d != b'0') {
                        return Err(PyError::Syntax); // leading zeros
                    }
                    if lit.len() > MAX_INT_DIGITS {
                        return Err(PyError::Syntax);
                    }
                    out.push(Tok::Int(lit));
                }
            }
            b'+' => {
                out.push(Tok::Plus);
                i += 1
            }
            b'-' => {
                out.push(Tok::Minus);
                i += 1
            }
            // `**` and `//` before `*` and `/`.
            c @ (b'*' | b'/') => {
                let doubled = b.get(i + 1) == Some(&c);
                out.push(match (c, doubled) {
                    (b'*', true) => Tok::DStar,
                    (b'*', false) => Tok::Star,
                    (_, true) => Tok::DSlash,
                    (_, false) => Tok::Slash,
                });
                i += 1 + usize::from(doubled)
            }
            b'(' => {
                level += 1;
                out.push(Tok::LPar);
                i += 1
            }
            b')' => {
                level -= 1;
                out.push(Tok::RPar);
                i += 1
            }
            _ => return Err(PyError::Syntax),
        }
    }
    Ok(out)
}

/// Where the first token may start: `eval` strips leading spaces and tabs, then blank lines are
/// skipped, and the first real line must not be indented (a form feed resets the column:
/// `"\r25"` and `" \x0c25"` are 25, `"\n 25"` and `"\x0c 25"` are `IndentationError`s).
fn leading_blank(b: &[u8]) -> R<usize> {
    let mut i = 0;
    while i < b.len() && (b[i] == b' ' || b[i] == b'\t') {
        i += 1;
    }
    loop {
        let mut col = 0usize;
        let mut j = i;
        while j < b.len() {
            match b[j] {
                b' ' => col += 1,
                b'\t' => col = (col / 8 + 1) * 8,
                0x0c => col = 0,
                _ => break,
            }
            j += 1;
        }
        if j < b.len() && (b[j] == b'\r' || b[j] == b'\n') {
            i = j + 1;
            continue;
        }
        if col != 0 {
            return Err(PyError::Syntax);
        }
        return Ok(j);
    }
}

/// After a top-level newline: CPython accepts only blank lines, and a last line (with no newline
/// after it) whose indentation comes back to column 0 (a form feed resets the column; `"1\n  "` is
/// an `IndentationError`, `"1\n\t\n"` and `"1\r\x0c"` are fine).
fn trailing_lines_blank(rest: &str) -> bool {
    let mut col = 0usize;
    for c in rest.bytes() {
        match c {
            b'\r' | b'\n' => col = 0,
            b' ' => col += 1,
            b'\t' => col = (col / 8 + 1) * 8,
            0x0c => col = 0,
            _ => return false,
        }
    }
    col == 0
}

struct Parser<'a> {
    toks: Vec<Tok<'a>>,
    pos: usize,
}

/// A value and the depth of the expression tree that produced it.
type V = (PyNum, u32);

fn deeper(d: u32) -> R<u32> {
    if d + 1 > MAX_AST_DEPTH {
        Err(PyError::TooDeep)
    } else {
        Ok(d + 1)
    }
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<Tok<'a>> {
        self.toks.get(self.pos).copied()
    }

    fn expr(&mut self, parens: usize) -> R<V> {
        let (mut v, mut d) = self.term(parens)?;
        while let Some(t @ (Tok::Plus | Tok::Minus)) = self.peek() {
            self.pos += 1;
            let (r, rd) = self.term(parens)?;
            v = if t == Tok::Plus {
                add(&v, &r)?
            } else {
                sub(&v, &r)?
            };
            d = deeper(d.max(rd))?;
        }
        Ok((v, d))
    }

    fn term(&mut self, parens: usize) -> R<V> {
        let (mut v, mut d) = self.factor(parens)?;
        while let Some(t @ (Tok::Star | Tok::Slash | Tok::DSlash)) = self.peek() {
            self.pos += 1;
            let (r, rd) = self.factor(parens)?;
            v = match t {
                Tok::Star => mul(&v, &r)?,
                Tok::Slash => truediv(&v, &r)?,
                _ => floordiv(&v, &r)?,
            };
            d = deeper(d.max(rd))?;
        }
        Ok((v, d))
    }

    /// Signs, then a power; returns the signs (true = minus) outermost first.
    fn signs(&mut self) -> Vec<bool> {
        let mut s = Vec::new();
        while let Some(t @ (Tok::Plus | Tok::Minus)) = self.peek() {
            self.pos += 1;
            s.push(t == Tok::Minus);
        }
        s
    }

    fn apply_signs(signs: &[bool], (mut v, mut d): V) -> R<V> {
        for &minus in signs.iter().rev() {
            if minus {
                v = neg(&v)?;
            }
            d = deeper(d)?;
        }
        Ok((v, d))
    }

    fn factor(&mut self, parens: usize) -> R<V> {
        let signs = self.signs();
        let p = self.power(parens)?;
        Self::apply_signs(&signs, p)
    }

    /// `primary ('**' signs primary)*`, right-associative: `a ** -b ** c == a ** (-(b ** c))`.
    fn power(&mut self, parens: usize) -> R<V> {
        let first = self.primary(parens)?;
        let mut rest: Vec<(Vec<bool>, V)> = Vec::new();
        while self.peek() == Some(Tok::DStar) {
            self.pos += 1;
            let signs = self.signs();
            let p = self.primary(parens)?;
            rest.push((signs, p));
        }
        let Some((last_signs, last)) = rest.pop() else {
            return Ok(first);
        };
        let mut acc = Self::apply_signs(&last_signs, last)?;
        while let Some((signs, (p, pd))) = rest.pop() {
            let v = pow(&p, &acc.0)?;
            acc = Self::apply_signs(&signs, (v, deeper(pd.max(acc.1))?))?;
        }
        let v = pow(&first.0, &acc.0)?;
        Ok((v, deeper(first.1.max(acc.1))?))
    }

    fn primary(&mut self, parens: usize) -> R<V> {
        let v = match self.peek() {
            Some(Tok::Int(lit)) => {
                self.pos += 1;
                (
                    PyNum::Int(Int::from_decimal(lit).ok_or(PyError::Syntax)?),
                    1,
                )
            }
            Some(Tok::Float(lit)) => {
                self.pos += 1;
                // ok-free: Python float literals are a subset of what Rust's parser accepts
                let f: f64 = lit.parse().map_err(|_| PyError::Syntax)?;
                (PyNum::Float(f), 1)
            }
            Some(Tok::LPar) => {
                if parens + 1 > MAX_PAREN_DEPTH {
                    return Err(PyError::TooDeep);
                }
                self.pos += 1;
                if self.peek() == Some(Tok::RPar) {
                    // `()` is the empty tuple: no arithmetic on it succeeds, nor does the final
                    // comparison with the target
                    return Err(PyError::Type);
                }
                let v = self.expr(parens + 1)?;
                if self.peek() != Some(Tok::RPar) {
                    return Err(PyError::Syntax);
                }
                self.pos += 1;
                v
            }
            _ => return Err(PyError::Syntax),
        };
        if self.peek() == Some(Tok::LPar) {
            // `2(3)`: calling a number is a TypeError (after a SyntaxWarning)
            return Err(PyError::Type);
        }
        Ok(v)
    }
}

/// Evaluate `s` as CPython 3.11's `eval(s, {"__builtins__": None}, {})` would, for strings over
/// TinyZero's character set (anything else is a syntax error, as in Python).
pub fn eval(s: &str) -> R<PyNum> {
    let toks = tokenize(s)?;
    let mut p = Parser { toks, pos: 0 };
    let (v, _) = p.expr(0)?;
    if p.pos != p.toks.len() {
        return Err(PyError::Syntax);
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn f(s: &str) -> R<PyNum> {
        eval(s)
    }
    fn int(v: i128) -> R<PyNum> {
        Ok(PyNum::Int(Int::Small(v)))
    }
    fn fl(v: f64) -> R<PyNum> {
        Ok(PyNum::Float(v))
    }

    /// Figures from CPython 3.11 (`eval(s, {"__builtins__": None}, {})`).
    #[test]
    fn cpython_figures() {
        assert_eq!(f("1+\x0c2"), int(3));
        assert_eq!(f("1+\x0b2"), Err(PyError::Syntax));
        assert_eq!(f("(1+\r2)"), int(3));
        assert_eq!(f("1+\r2"), Err(PyError::Syntax));
        assert_eq!(f("(1\r+2)"), int(3));
        assert_eq!(f("0\r"), int(0));
        assert_eq!(f("1\n\t\n"), int(1));
        assert_eq!(f("1\r\x0c"), int(1));
        assert_eq!(f("1\n  "), Err(PyError::Syntax)); // IndentationError
        assert_eq!(f("1\n2"), Err(PyError::Syntax));
        assert_eq!(f("\r25"), int(25));
        assert_eq!(f(" \x0c25"), int(25));
        assert_eq!(f("\n 25"), Err(PyError::Syntax));
        assert_eq!(f("\x0c 25"), Err(PyError::Syntax));
        assert_eq!(f("007"), Err(PyError::Syntax));
        assert_eq!(f("00"), int(0));
        assert_eq!(f("007."), fl(7.0));
        assert_eq!(f("00.5"), fl(0.5));
        assert_eq!(f("1.2.3"), Err(PyError::Syntax));
        assert_eq!(f("2(3)"), Err(PyError::Type));
        assert!(f("()").is_err());
        assert_eq!(f(&format!("{}1", "-".repeat(200))), int(1));
        assert_eq!(f(&format!("{}1", "-".repeat(1000))), int(1));
        assert_eq!(f(&format!("{}1", "-".repeat(2990))), int(1));
        assert!(f(&format!("{}1", "-".repeat(5000))).is_err());
        assert_eq!(
            f(&format!("{}1{}", "(".repeat(200), ")".repeat(200))),
            int(1)
        );
        assert!(f(&format!("{}1{}", "(".repeat(201), ")".repeat(201))).is_err());
        assert_eq!(f("2**-1"), fl(0.5));
        assert_eq!(f("-2**2"), int(-4));
        assert_eq!(f("2**3**2"), int(512));
        assert_eq!(
            f("(-8)**(1/3)"),
            Ok(PyNum::Complex(1.0000000000000002, 1.7320508075688772))
        );
        assert_eq!(
            f("(1-2)**(1/2)"),
            Ok(PyNum::Complex(6.123233995736766e-17, 1.0))
        );
        assert_eq!(
            f("((1-2)**(1/2))**2"),
            Ok(PyNum::Complex(-1.0, 1.2246467991473532e-16))
        );
        assert_eq!(f("7//2"), int(3));
        assert_eq!(f("7.0//2"), fl(3.0));
        assert_eq!(f("-7//2"), int(-4));
        assert_eq!(f("2**0.5"), fl(std::f64::consts::SQRT_2));
        assert_eq!(f("1/3"), fl(0.3333333333333333));
        assert_eq!(f("10**400/10**399"), fl(10.0));
        assert_eq!(f("10**400*1.0"), Err(PyError::Overflow));
        assert_eq!(f("1 .5"), Err(PyError::Syntax));
        assert_eq!(f("1. 5"), Err(PyError::Syntax));
        assert_eq!(f("1."), fl(1.0));
        assert_eq!(f(".5"), fl(0.5));
        assert_eq!(f("1..2"), Err(PyError::Syntax));
        assert_eq!(f("2* *3"), Err(PyError::Syntax));
        assert_eq!(f("+-+3"), int(-3));
        assert_eq!(f("3*-2"), int(-6));
        assert_eq!(f("2**--2"), int(4));
        assert_eq!(f("0**-1"), Err(PyError::ZeroDivision));
        assert_eq!(f("0.0**-1"), Err(PyError::ZeroDivision));
        assert_eq!(
            f("(-1)**0.5"),
            Ok(PyNum::Complex(6.123233995736766e-17, 1.0))
        );
        assert_eq!(f("8/3*3+1"), fl(9.0));
        assert_eq!(f("\t1+2"), int(3));
        assert!(f(&"1".repeat(4300)).is_ok());
        assert_eq!(f(&"1".repeat(4301)), Err(PyError::Syntax));
        assert_eq!(f(&format!("{}.", "1".repeat(4301))), fl(f64::INFINITY));
        assert_eq!(f("(2**70000)//(2**69999)"), Err(PyError::TooLarge)); // Python: 2 (bounded here)
        assert_eq!(f("(2**9801)//(2**9800)"), int(2));
        assert_eq!(f("10**309/1"), Err(PyError::Overflow));
        assert_eq!(f("10**309/10"), fl(1e308));
        assert_eq!(f("1/10**400"), fl(0.0));
        assert_eq!(f(""), Err(PyError::Syntax));
        assert_eq!(f("..."), Err(PyError::Syntax));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn never_panics_on_any_string(s in ".{0,64}") {
            let _ = eval(&s);
        }

        #[test]
        fn never_panics_on_the_allowed_alphabet(s in "[0-9+*/().\\- \t\r]{0,48}") {
            let _ = eval(&s);
        }
    }
}

/// Differential tests against CPython 3.11 itself: `fixtures/score/pyexpr_cases.jsonl` holds
/// `eval` results on random strings (scripts/gen_countdown_fixtures.py).
#[cfg(test)]
pub(crate) mod cpython_fixture {
    use super::*;

    /// Run `check` on every line of a JSON-lines fixture of CPython results; `Some(message)`
    /// marks a line where rlcr differs. Fails listing every difference, or when the fixture has
    /// `min_cases` lines or fewer.
    pub(crate) fn assert_matches_fixture(
        text: &str,
        min_cases: usize,
        mut check: impl FnMut(&serde_json::Value) -> Option<String>,
    ) {
        let mut n = 0;
        let mut bad = Vec::new();
        for line in text.lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            bad.extend(check(&v));
            n += 1;
        }
        assert!(n > min_cases);
        assert!(
            bad.is_empty(),
            "{} of {n} differ:\n{}",
            bad.len(),
            bad.join("\n")
        );
    }

    #[test]
    fn matches_cpython_on_random_expressions() {
        let text = include_str!("../../fixtures/score/pyexpr_cases.jsonl");
        assert_matches_fixture(text, 1000, |v| {
            let expr = v["expr"].as_str().unwrap();
            let kind = v["kind"].as_str().unwrap();
            let got = eval(expr);
            let ok = match (kind, &got) {
                ("error", Err(_)) => true,
                ("int", Ok(PyNum::Int(i))) => {
                    let want = v["value"].as_str().unwrap();
                    let (neg, digits) = match want.strip_prefix('-') {
                        Some(d) => (true, d),
                        None => (false, want),
                    };
                    let w = Int::from_decimal(digits).unwrap();
                    let w = if neg { w.neg().unwrap() } else { w };
                    &w == i
                }
                ("float", Ok(PyNum::Float(f))) => {
                    let want: f64 = py_repr_f64(v["value"].as_str().unwrap());
                    f.to_bits() == want.to_bits()
                        || (f.is_nan() && want.is_nan())
                        || (*f == 0.0 && want == 0.0)
                }
                ("complex", Ok(PyNum::Complex(r, i))) => {
                    let wr = py_repr_f64(v["value"][0].as_str().unwrap());
                    let wi = py_repr_f64(v["value"][1].as_str().unwrap());
                    let same = |a: f64, b: f64| {
                        a.to_bits() == b.to_bits()
                            || (a.is_nan() && b.is_nan())
                            || (a == 0.0 && b == 0.0)
                    };
                    same(*r, wr) && same(*i, wi)
                }
                _ => false,
            };
            (!ok).then(|| format!("{expr:?}: python {kind} {} vs ours {got:?}", v["value"]))
        });
    }

    fn py_repr_f64(s: &str) -> f64 {
        match s {
            "inf" => f64::INFINITY,
            "-inf" => f64::NEG_INFINITY,
            "nan" => f64::NAN,
            _ => s.parse().unwrap(),
        }
    }
}
