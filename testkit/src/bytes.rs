//! A batch's or a buffer's bytes read back as values, in the machine's byte order (as the data
//! sources and the executors write them): what the data tests compare.

/// `b` as f32 values (its length a multiple of 4).
pub fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
        .collect()
}

/// `b` as i64 values (its length a multiple of 8).
pub fn i64s(b: &[u8]) -> Vec<i64> {
    b.chunks_exact(8)
        .map(|c| i64::from_ne_bytes(c.try_into().unwrap()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_written_in_the_machines_order_read_back_the_same() {
        let f = [1.5f32.to_ne_bytes(), (-2.0f32).to_ne_bytes()].concat();
        assert_eq!(f32s(&f), [1.5, -2.0]);
        let i = [7i64.to_ne_bytes(), (-9i64).to_ne_bytes()].concat();
        assert_eq!(i64s(&i), [7, -9]);
    }
}
