//! Kubernetes quantities ("1Gi", "500M", "1.5Ti", "4186112Ki") as bytes, for comparing sizes
//! and capacities; None for what does not parse (milli-units, exponents: never a size here).

/// The bytes `text` stands for, rounded up.
pub fn bytes(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let factor: u64 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "Ei" => 1 << 60,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "E" => 1_000_000_000_000_000_000,
        _ => return None,
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() {
        return None;
    }
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let mut total = whole.checked_mul(factor)?;
    if !fraction.is_empty() {
        let digits: u32 = fraction.len().try_into().ok().filter(|d| *d <= 18)?;
        let parts: u128 = fraction.parse().ok()?;
        let scale = 10u128.pow(digits);
        let extra = (parts * u128::from(factor)).div_ceil(scale);
        total = total.checked_add(u64::try_from(extra).ok()?)?;
    }
    Some(total)
}

#[cfg(test)]
mod tests {
    use super::bytes;

    #[test]
    fn quantities_read_as_bytes() {
        assert_eq!(bytes("1Gi"), Some(1 << 30));
        assert_eq!(bytes("4186112Ki"), Some(4_186_112 * 1024));
        assert_eq!(bytes("500M"), Some(500_000_000));
        assert_eq!(bytes("1.5Gi"), Some(3 << 29));
        assert_eq!(bytes("123"), Some(123));
        assert_eq!(bytes("0.1"), Some(1));
        for bad in [
            "",
            "Gi",
            "1Xi",
            "100m",
            "1e3",
            "-1",
            "1.2.3Gi",
            "99999999999Ei",
        ] {
            assert_eq!(bytes(bad), None, "{bad}");
        }
    }
}
