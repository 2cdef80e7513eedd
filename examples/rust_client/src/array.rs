//! n-dimensional arrays as msgpack extension type 1: `[dtype: str, shape: [u64], data: bin]`,
//! items little-endian in C order (docs/protocol.md, "Arrays").

use rmpv::Value;

use crate::error::ArrayError;

/// The msgpack extension type that carries an array.
pub const ARRAY_EXT_TYPE: i8 = 1;

/// An item type the protocol names (numpy's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    Float32,
    Float64,
    Int8,
    Int16,
    Int32,
    Int64,
    UInt8,
    UInt16,
    UInt32,
    UInt64,
    /// One byte per item, 0 or 1.
    Bool,
}

impl DType {
    /// Every dtype, in the order of docs/protocol.md.
    pub const ALL: [DType; 11] = [
        Self::Float32,
        Self::Float64,
        Self::Int8,
        Self::Int16,
        Self::Int32,
        Self::Int64,
        Self::UInt8,
        Self::UInt16,
        Self::UInt32,
        Self::UInt64,
        Self::Bool,
    ];

    /// numpy's name, as sent on the wire.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Float32 => "float32",
            Self::Float64 => "float64",
            Self::Int8 => "int8",
            Self::Int16 => "int16",
            Self::Int32 => "int32",
            Self::Int64 => "int64",
            Self::UInt8 => "uint8",
            Self::UInt16 => "uint16",
            Self::UInt32 => "uint32",
            Self::UInt64 => "uint64",
            Self::Bool => "bool",
        }
    }

    /// The dtype of a wire name.
    pub fn from_name(name: &str) -> Result<Self, ArrayError> {
        Self::ALL.into_iter().find(|d| d.name() == name).ok_or_else(|| ArrayError::UnknownDtype(name.into()))
    }

    /// Bytes per item.
    #[must_use]
    pub fn itemsize(self) -> usize {
        match self {
            Self::Int8 | Self::UInt8 | Self::Bool => 1,
            Self::Int16 | Self::UInt16 => 2,
            Self::Float32 | Self::Int32 | Self::UInt32 => 4,
            Self::Float64 | Self::Int64 | Self::UInt64 => 8,
        }
    }

    /// Whether items are integers (bool included), which `NdArray::to_i64_vec` reads exactly.
    #[must_use]
    pub fn is_integer(self) -> bool {
        !matches!(self, Self::Float32 | Self::Float64)
    }
}

/// An array as it travels: dtype, shape and the raw little-endian bytes in C order.
///
/// The constructors check that `data` holds exactly `prod(shape) * itemsize` bytes, so every
/// `NdArray` is one the server accepts.
#[derive(Debug, Clone, PartialEq)]
pub struct NdArray {
    dtype: DType,
    shape: Vec<u64>,
    data: Vec<u8>,
}

/// `prod(shape) * itemsize`, checked.
fn byte_len(dtype: DType, shape: &[u64]) -> Result<usize, ArrayError> {
    shape
        .iter()
        .try_fold(dtype.itemsize(), |acc, &d| usize::try_from(d).ok().and_then(|d| acc.checked_mul(d)))
        .ok_or_else(|| ArrayError::ShapeOverflow(shape.to_vec()))
}

impl NdArray {
    /// An array from its raw bytes (little-endian, C order).
    pub fn new(dtype: DType, shape: Vec<u64>, data: Vec<u8>) -> Result<Self, ArrayError> {
        let expected = byte_len(dtype, &shape)?;
        if data.len() != expected {
            return Err(ArrayError::DataLength { expected, actual: data.len() });
        }
        Ok(Self { dtype, shape, data })
    }

    /// A float32 array of the given shape.
    pub fn from_f32(shape: Vec<u64>, values: &[f32]) -> Result<Self, ArrayError> {
        Self::new(DType::Float32, shape, values.iter().flat_map(|v| v.to_le_bytes()).collect())
    }

    /// A float64 array of the given shape.
    pub fn from_f64(shape: Vec<u64>, values: &[f64]) -> Result<Self, ArrayError> {
        Self::new(DType::Float64, shape, values.iter().flat_map(|v| v.to_le_bytes()).collect())
    }

    /// An int64 array of the given shape.
    pub fn from_i64(shape: Vec<u64>, values: &[i64]) -> Result<Self, ArrayError> {
        Self::new(DType::Int64, shape, values.iter().flat_map(|v| v.to_le_bytes()).collect())
    }

    /// A one-dimensional float32 array (the observation of a `Box((n,), float32)`).
    #[must_use]
    pub fn vector_f32(values: &[f32]) -> Self {
        Self {
            dtype: DType::Float32,
            shape: vec![values.len() as u64],
            data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }

    #[must_use]
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    #[must_use]
    pub fn shape(&self) -> &[u64] {
        &self.shape
    }

    /// The raw bytes, little-endian, C order.
    #[must_use]
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    /// The number of items (1 for a scalar, `shape = []`).
    #[must_use]
    pub fn len(&self) -> usize {
        self.data.len() / self.dtype.itemsize()
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The items as f64 (exact for every dtype but int64/uint64 beyond 2^53).
    #[must_use]
    #[allow(clippy::cast_possible_wrap)] // not a cast that wraps: u64 -> f64
    pub fn to_f64_vec(&self) -> Vec<f64> {
        let d = &self.data;
        match self.dtype {
            DType::Float32 => d.chunks_exact(4).map(|c| f64::from(f32::from_le_bytes(arr(c)))).collect(),
            DType::Float64 => d.chunks_exact(8).map(|c| f64::from_le_bytes(arr(c))).collect(),
            DType::UInt64 => d.chunks_exact(8).map(|c| u64::from_le_bytes(arr(c)) as f64).collect(),
            DType::Int64 => d.chunks_exact(8).map(|c| i64::from_le_bytes(arr(c)) as f64).collect(),
            _ => self.to_i64_vec().unwrap_or_default().into_iter().map(|v| v as f64).collect(),
        }
    }

    /// The items as f32 (rounded from other dtypes).
    #[must_use]
    #[allow(clippy::cast_possible_truncation)] // f64 -> f32 rounds, as numpy's astype does
    pub fn to_f32_vec(&self) -> Vec<f32> {
        if self.dtype == DType::Float32 {
            return self.data.chunks_exact(4).map(|c| f32::from_le_bytes(arr(c))).collect();
        }
        self.to_f64_vec().into_iter().map(|v| v as f32).collect()
    }

    /// The items as i64, for integer and bool dtypes; `None` for floats and for uint64 items
    /// above `i64::MAX`.
    #[must_use]
    pub fn to_i64_vec(&self) -> Option<Vec<i64>> {
        let d = &self.data;
        Some(match self.dtype {
            DType::Float32 | DType::Float64 => return None,
            DType::Bool | DType::UInt8 => d.iter().map(|&b| i64::from(b)).collect(),
            DType::Int8 => d.iter().map(|&b| i64::from(i8::from_le_bytes([b]))).collect(),
            DType::Int16 => d.chunks_exact(2).map(|c| i64::from(i16::from_le_bytes(arr(c)))).collect(),
            DType::UInt16 => d.chunks_exact(2).map(|c| i64::from(u16::from_le_bytes(arr(c)))).collect(),
            DType::Int32 => d.chunks_exact(4).map(|c| i64::from(i32::from_le_bytes(arr(c)))).collect(),
            DType::UInt32 => d.chunks_exact(4).map(|c| i64::from(u32::from_le_bytes(arr(c)))).collect(),
            DType::Int64 => d.chunks_exact(8).map(|c| i64::from_le_bytes(arr(c))).collect(),
            DType::UInt64 => d
                .chunks_exact(8)
                .map(|c| i64::try_from(u64::from_le_bytes(arr(c))).ok())
                .collect::<Option<_>>()?,
        })
    }

    /// The msgpack payload of the extension: `[dtype, shape, data]`.
    #[must_use]
    pub fn encode_payload(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.data.len() + 16 + 9 * self.shape.len());
        // Writing into a Vec cannot fail.
        let _ = rmp::encode::write_array_len(&mut out, 3);
        let _ = rmp::encode::write_str(&mut out, self.dtype.name());
        let _ = rmp::encode::write_array_len(&mut out, self.shape.len() as u32);
        for &d in &self.shape {
            let _ = rmp::encode::write_uint(&mut out, d);
        }
        let _ = rmp::encode::write_bin(&mut out, &self.data);
        out
    }

    /// Reads the extension's payload.
    pub fn decode_payload(payload: &[u8]) -> Result<Self, ArrayError> {
        let mut rest = payload;
        let value = rmpv::decode::read_value(&mut rest).map_err(|e| ArrayError::Malformed(e.to_string()))?;
        if !rest.is_empty() {
            return Err(ArrayError::Malformed(format!("{} bytes after the payload", rest.len())));
        }
        let Value::Array(items) = value else {
            return Err(ArrayError::Malformed("the payload is not a msgpack array".into()));
        };
        let [dtype, shape, data] = <[Value; 3]>::try_from(items).map_err(|items| {
            ArrayError::Malformed(format!("the payload has {} items, not 3", items.len()))
        })?;
        let dtype = match dtype {
            Value::String(s) => DType::from_name(s.as_str().unwrap_or_default())?,
            other => return Err(ArrayError::Malformed(format!("dtype is not a string: {other}"))),
        };
        let shape = match shape {
            Value::Array(dims) => dims
                .iter()
                .map(|d| {
                    d.as_u64().ok_or_else(|| ArrayError::Malformed(format!("shape entry {d} is not a u64")))
                })
                .collect::<Result<Vec<_>, _>>()?,
            other => return Err(ArrayError::Malformed(format!("shape is not an array: {other}"))),
        };
        let Value::Binary(data) = data else {
            return Err(ArrayError::Malformed("data is not bin".into()));
        };
        Self::new(dtype, shape, data)
    }

    /// The array as a msgpack value (extension type 1).
    #[must_use]
    pub fn to_value(&self) -> Value {
        Value::Ext(ARRAY_EXT_TYPE, self.encode_payload())
    }

    /// Reads an array from a msgpack value, which must be extension type 1.
    pub fn from_value(value: &Value) -> Result<Self, ArrayError> {
        match value {
            Value::Ext(ARRAY_EXT_TYPE, payload) => Self::decode_payload(payload),
            Value::Ext(other, _) => Err(ArrayError::Malformed(format!("extension type {other}, not 1"))),
            other => Err(ArrayError::Malformed(format!("not an extension value: {other}"))),
        }
    }
}

impl From<&NdArray> for Value {
    fn from(a: &NdArray) -> Self {
        a.to_value()
    }
}

impl From<NdArray> for Value {
    fn from(a: NdArray) -> Self {
        a.to_value()
    }
}

/// A chunk of `chunks_exact(N)` as an array (the length is N by construction).
fn arr<const N: usize>(chunk: &[u8]) -> [u8; N] {
    let mut out = [0; N];
    out.copy_from_slice(chunk);
    out
}

#[cfg(test)]
#[allow(clippy::float_cmp)] // the values are compared bit for bit on purpose
mod tests {
    use super::*;

    #[test]
    fn dtype_names_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_name(d.name()), Ok(d));
        }
        assert_eq!(DType::from_name("float16"), Err(ArrayError::UnknownDtype("float16".into())));
    }

    #[test]
    fn f32_payload_is_the_documented_layout() {
        let a = NdArray::from_f32(vec![2], &[1.0, -2.5]).unwrap();
        let payload = a.encode_payload();
        // fixarray(3), fixstr(7) "float32", fixarray(1) [2], bin8 of 8 bytes.
        let mut expected = vec![0x93, 0xa7];
        expected.extend_from_slice(b"float32");
        expected.extend_from_slice(&[0x91, 0x02, 0xc4, 0x08]);
        expected.extend_from_slice(&1.0f32.to_le_bytes());
        expected.extend_from_slice(&(-2.5f32).to_le_bytes());
        assert_eq!(payload, expected);
        assert_eq!(a.to_value(), Value::Ext(1, expected));
    }

    #[test]
    fn arrays_round_trip_through_values() {
        let cases = [
            NdArray::from_f32(vec![2, 3], &[0.0, 1.5, -1.0, f32::INFINITY, f32::NEG_INFINITY, 1e-30])
                .unwrap(),
            NdArray::from_f64(vec![], &[std::f64::consts::PI]).unwrap(),
            NdArray::from_i64(vec![3], &[i64::MIN, 0, i64::MAX]).unwrap(),
            NdArray::new(DType::Bool, vec![2, 2], vec![0, 1, 1, 0]).unwrap(),
            NdArray::new(DType::UInt8, vec![0, 5], vec![]).unwrap(),
            NdArray::vector_f32(&[0.25; 300]),
        ];
        for a in cases {
            let v = a.to_value();
            // Through the msgpack bytes, as on the wire.
            let mut bytes = Vec::new();
            rmpv::encode::write_value(&mut bytes, &v).unwrap();
            let back = rmpv::decode::read_value(&mut bytes.as_slice()).unwrap();
            assert_eq!(NdArray::from_value(&back).unwrap(), a);
        }
    }

    #[test]
    fn conversions_read_every_dtype() {
        let i16s = NdArray::new(DType::Int16, vec![2], [(-3i16).to_le_bytes(), 7i16.to_le_bytes()].concat())
            .unwrap();
        assert_eq!(i16s.to_i64_vec(), Some(vec![-3, 7]));
        assert_eq!(i16s.to_f64_vec(), vec![-3.0, 7.0]);
        let u64s = NdArray::new(DType::UInt64, vec![1], u64::MAX.to_le_bytes().to_vec()).unwrap();
        assert_eq!(u64s.to_i64_vec(), None);
        let f = NdArray::from_f64(vec![2], &[0.1, 2.0]).unwrap();
        assert_eq!(f.to_i64_vec(), None);
        assert_eq!(f.to_f32_vec(), vec![0.1f32, 2.0]);
        assert_eq!(NdArray::from_f64(vec![], &[5.0]).unwrap().len(), 1);
    }

    #[test]
    fn bad_arrays_are_refused() {
        assert_eq!(
            NdArray::from_f32(vec![3], &[1.0]).unwrap_err(),
            ArrayError::DataLength { expected: 12, actual: 4 }
        );
        assert!(matches!(
            NdArray::new(DType::Float64, vec![u64::MAX, 2], vec![]),
            Err(ArrayError::ShapeOverflow(_))
        ));
        let ext = |items: Vec<Value>| {
            let mut p = Vec::new();
            rmpv::encode::write_value(&mut p, &Value::Array(items)).unwrap();
            Value::Ext(1, p)
        };
        let bad = [
            ext(vec![Value::from("float32"), Value::Array(vec![Value::from(1)])]),
            ext(vec![Value::from("complex64"), Value::Array(vec![]), Value::Binary(vec![0; 8])]),
            ext(vec![Value::from("int8"), Value::Array(vec![Value::from(-1)]), Value::Binary(vec![])]),
            ext(vec![Value::from("int8"), Value::Array(vec![Value::from(2)]), Value::from("ab")]),
            ext(vec![Value::from("int8"), Value::Array(vec![Value::from(2)]), Value::Binary(vec![1])]),
            Value::Ext(2, vec![0x90]),
            Value::Ext(1, vec![0x93, 0xc1]),
            Value::from(3),
        ];
        for v in &bad {
            assert!(NdArray::from_value(v).is_err(), "{v} was accepted");
        }
        // Trailing bytes after the payload.
        let mut payload = NdArray::vector_f32(&[1.0]).encode_payload();
        payload.push(0xc0);
        assert!(NdArray::decode_payload(&payload).is_err());
    }
}
