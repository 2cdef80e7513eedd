//! Frames: a big-endian u32 length, then that many bytes of one msgpack value, a map with a
//! string `"type"` (docs/protocol.md, "Frames").

use std::io::{Read, Write};

use rmpv::Value;

use crate::error::ClientError;

/// The server's default `max_frame_bytes`, used for incoming frames unless the client is told
/// otherwise.
pub const DEFAULT_MAX_FRAME_BYTES: usize = 16 << 20;

/// Appends one frame holding `body` to `out`.
///
/// The frame is built whole so that it goes out in one `write` (one TCP segment for small
/// requests with `TCP_NODELAY`).
pub fn encode_frame(body: &Value, out: &mut Vec<u8>, max_frame_bytes: usize) -> Result<(), ClientError> {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    // Writing into a Vec cannot fail; the error is kept only to avoid an unwrap.
    rmpv::encode::write_value(out, body)
        .map_err(|e| ClientError::Io(std::io::Error::other(e.to_string())))?;
    let length = out.len() - start - 4;
    if length > max_frame_bytes {
        out.truncate(start);
        return Err(ClientError::FrameTooLarge { length, max: max_frame_bytes });
    }
    let header =
        u32::try_from(length).map_err(|_| ClientError::FrameTooLarge { length, max: u32::MAX as usize })?;
    out[start..start + 4].copy_from_slice(&header.to_be_bytes());
    Ok(())
}

/// Writes one frame.
pub fn write_frame<W: Write>(w: &mut W, body: &Value, max_frame_bytes: usize) -> Result<(), ClientError> {
    let mut buf = Vec::new();
    encode_frame(body, &mut buf, max_frame_bytes)?;
    w.write_all(&buf)?;
    w.flush()?;
    Ok(())
}

/// Reads one frame; a length above `max_frame_bytes` is refused before its body is read.
///
/// End of stream before or inside a frame is `ClientError::Closed`.
pub fn read_frame<R: Read>(r: &mut R, max_frame_bytes: usize) -> Result<Value, ClientError> {
    let mut header = [0u8; 4];
    r.read_exact(&mut header)?;
    let length = u32::from_be_bytes(header) as usize;
    if length > max_frame_bytes {
        return Err(ClientError::FrameTooLarge { length, max: max_frame_bytes });
    }
    let mut body = vec![0u8; length];
    r.read_exact(&mut body)?;
    decode_body(&body)
}

/// Decodes a frame body: exactly one msgpack map with a string `"type"`.
pub fn decode_body(body: &[u8]) -> Result<Value, ClientError> {
    let mut rest = body;
    let value = rmpv::decode::read_value(&mut rest).map_err(|e| ClientError::Decode(e.to_string()))?;
    if !rest.is_empty() {
        return Err(ClientError::Decode(format!("{} bytes after the body's value", rest.len())));
    }
    if message_type(&value).is_none() {
        return Err(ClientError::Decode(format!("not a map with a string \"type\": {value}")));
    }
    Ok(value)
}

/// The value under a string key of a msgpack map (the first, if there are several).
#[must_use]
pub fn get<'a>(map: &'a Value, key: &str) -> Option<&'a Value> {
    match map {
        Value::Map(entries) => entries.iter().find(|(k, _)| k.as_str() == Some(key)).map(|(_, v)| v),
        _ => None,
    }
}

/// A message's `"type"`.
#[must_use]
pub fn message_type(message: &Value) -> Option<&str> {
    get(message, "type").and_then(Value::as_str)
}

/// A message: a map of `"type"` and the given keys, in that order.
#[must_use]
pub fn message(kind: &str, fields: Vec<(&str, Value)>) -> Value {
    let mut entries = Vec::with_capacity(fields.len() + 1);
    entries.push((Value::from("type"), Value::from(kind)));
    entries.extend(fields.into_iter().map(|(k, v)| (Value::from(k), v)));
    Value::Map(entries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::array::NdArray;

    #[test]
    fn a_ping_is_the_documented_bytes() {
        let mut out = Vec::new();
        encode_frame(&message("ping", vec![]), &mut out, DEFAULT_MAX_FRAME_BYTES).unwrap();
        // length 11; fixmap(1), fixstr(4) "type", fixstr(4) "ping".
        let mut expected = vec![0, 0, 0, 11, 0x81, 0xa4];
        expected.extend_from_slice(b"type");
        expected.push(0xa4);
        expected.extend_from_slice(b"ping");
        assert_eq!(out, expected);
    }

    #[test]
    fn frames_round_trip_back_to_back() {
        let a = message(
            "get_action",
            vec![
                ("episode_id", Value::from("ep-1")),
                ("observation", NdArray::vector_f32(&[0.5, -0.5]).into()),
            ],
        );
        let b = message(
            "log_returns",
            vec![("reward", Value::from(1.0)), ("info", Value::Nil), ("done", Value::Nil)],
        );
        let mut wire = Vec::new();
        write_frame(&mut wire, &a, DEFAULT_MAX_FRAME_BYTES).unwrap();
        write_frame(&mut wire, &b, DEFAULT_MAX_FRAME_BYTES).unwrap();
        let mut r = wire.as_slice();
        assert_eq!(read_frame(&mut r, DEFAULT_MAX_FRAME_BYTES).unwrap(), a);
        assert_eq!(read_frame(&mut r, DEFAULT_MAX_FRAME_BYTES).unwrap(), b);
        assert!(matches!(read_frame(&mut r, DEFAULT_MAX_FRAME_BYTES), Err(ClientError::Closed)));
        assert_eq!(message_type(&a), Some("get_action"));
        assert_eq!(get(&b, "reward"), Some(&Value::from(1.0)));
        assert_eq!(get(&b, "missing"), None);
    }

    #[test]
    fn oversized_frames_are_refused_both_ways() {
        let big = message("x", vec![("data", Value::Binary(vec![0; 100]))]);
        let mut out = vec![9];
        assert!(matches!(encode_frame(&big, &mut out, 64), Err(ClientError::FrameTooLarge { max: 64, .. })));
        assert_eq!(out, vec![9], "a refused frame leaves the buffer as it was");
        // A header announcing 1 MiB is refused before any body byte is read.
        let wire = [0u8, 0x10, 0, 0];
        let err = read_frame(&mut wire.as_slice(), 1024).unwrap_err();
        assert!(matches!(err, ClientError::FrameTooLarge { length: 0x0010_0000, max: 1024 }));
    }

    #[test]
    fn truncated_and_bad_bodies_are_errors() {
        // Cut inside the header and inside the body.
        assert!(matches!(read_frame(&mut [0u8, 0].as_slice(), 64), Err(ClientError::Closed)));
        assert!(matches!(read_frame(&mut [0u8, 0, 0, 5, 0x81].as_slice(), 64), Err(ClientError::Closed)));
        // Not a map, a map without "type", a non-string type, trailing bytes, invalid msgpack.
        for body in
            [&[0x01][..], &[0x80], &[0x81, 0xa4, b't', b'y', b'p', b'e', 0x01], &[0x80, 0x80], &[0xc1]]
        {
            let mut wire = (body.len() as u32).to_be_bytes().to_vec();
            wire.extend_from_slice(body);
            assert!(matches!(read_frame(&mut wire.as_slice(), 64), Err(ClientError::Decode(_))), "{body:?}");
        }
    }
}
