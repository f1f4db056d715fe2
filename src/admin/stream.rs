//! Bridges between gRPC message streams and the blocking `Read`/`Write` the export stream
//! code uses. Both hold at most a few chunks, so memory stays bounded whatever is moved.

use std::io::{self, Read, Write};

use prost::bytes::Bytes;
use tokio::sync::mpsc;
use tonic::Status;

/// Bytes per gRPC message: well under tonic's 4 MiB message limit.
pub const CHUNK_BYTES: usize = 1 << 20;

/// Messages in flight between the blocking side and gRPC.
pub const CHUNKS_IN_FLIGHT: usize = 4;

/// Sends what is written as messages of up to `CHUNK_BYTES`, made by `wrap`. Fails with
/// BrokenPipe once the receiver (the client's call) is gone.
pub struct ChunkWriter<T> {
    tx: mpsc::Sender<Result<T, Status>>,
    buffer: Vec<u8>,
    wrap: fn(Vec<u8>) -> T,
}

impl<T> ChunkWriter<T> {
    pub fn new(tx: mpsc::Sender<Result<T, Status>>, wrap: fn(Vec<u8>) -> T) -> Self {
        ChunkWriter {
            tx,
            buffer: Vec::with_capacity(CHUNK_BYTES),
            wrap,
        }
    }

    fn send(&mut self) -> io::Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::replace(&mut self.buffer, Vec::with_capacity(CHUNK_BYTES));
        self.tx
            .blocking_send(Ok((self.wrap)(chunk)))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the client went away"))
    }
}

impl<T> Write for ChunkWriter<T> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        let taken = bytes.len().min(CHUNK_BYTES - self.buffer.len());
        self.buffer.extend_from_slice(&bytes[..taken]);
        if self.buffer.len() == CHUNK_BYTES {
            self.send()?;
        }
        Ok(taken)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.send()
    }
}

/// Reads the bytes of messages forwarded from a client stream; EOF when the client finished
/// sending, an error when its stream broke.
pub struct ChunkReader {
    rx: mpsc::Receiver<io::Result<Bytes>>,
    chunk: Bytes,
    offset: usize,
}

impl ChunkReader {
    pub fn new(rx: mpsc::Receiver<io::Result<Bytes>>) -> Self {
        ChunkReader {
            rx,
            chunk: Bytes::new(),
            offset: 0,
        }
    }
}

impl Read for ChunkReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.offset == self.chunk.len() {
            match self.rx.blocking_recv() {
                None => return Ok(0),
                Some(chunk) => {
                    self.chunk = chunk?;
                    self.offset = 0;
                }
            }
        }
        let n = buf.len().min(self.chunk.len() - self.offset);
        buf[..n].copy_from_slice(&self.chunk[self.offset..self.offset + n]);
        self.offset += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_arrive_in_order_as_bounded_chunks() {
        let (tx, mut rx) = mpsc::channel(CHUNKS_IN_FLIGHT);
        let writer = std::thread::spawn(move || {
            let mut out = ChunkWriter::new(tx, |bytes| bytes);
            let data: Vec<u8> = (0..(CHUNK_BYTES * 2 + 10)).map(|i| i as u8).collect();
            out.write_all(&data).unwrap();
            out.flush().unwrap();
            data
        });
        let mut got = Vec::new();
        while let Some(chunk) = rx.blocking_recv() {
            let chunk = chunk.unwrap();
            assert!(chunk.len() <= CHUNK_BYTES);
            got.extend(chunk);
        }
        assert_eq!(got, writer.join().unwrap());
    }

    #[test]
    fn a_gone_receiver_is_a_broken_pipe() {
        let (tx, rx) = mpsc::channel(1);
        drop(rx);
        let mut out = ChunkWriter::new(tx, |bytes: Vec<u8>| bytes);
        let err = out.write_all(&vec![0; CHUNK_BYTES]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
    }

    #[test]
    fn reads_join_chunks_and_pass_errors_on() {
        let (tx, rx) = mpsc::channel(4);
        tx.blocking_send(Ok(Bytes::from_static(b"abc"))).unwrap();
        tx.blocking_send(Ok(Bytes::new())).unwrap();
        tx.blocking_send(Ok(Bytes::from_static(b"de"))).unwrap();
        drop(tx);
        let mut text = String::new();
        ChunkReader::new(rx).read_to_string(&mut text).unwrap();
        assert_eq!(text, "abcde");

        let (tx, rx) = mpsc::channel(4);
        tx.blocking_send(Ok(Bytes::from_static(b"x"))).unwrap();
        tx.blocking_send(Err(io::Error::other("broken"))).unwrap();
        let mut all = Vec::new();
        let err = ChunkReader::new(rx).read_to_end(&mut all).unwrap_err();
        assert_eq!(err.to_string(), "broken");
    }
}
