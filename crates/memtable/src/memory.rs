//! Memory accounting: what the memtable's batches and index keep alive.

use arrow_array::{Array, RecordBatch};
use arrow_buffer::Buffer;
use arrow_data::ArrayData;

/// Memory a memtable holds, for backpressure and flush decisions.
///
/// - `payload_bytes`: the rows' own bytes (each array's slice-aware size:
///   the windows of its buffers that the rows use). This is what a flush
///   writes and what is reported as the SSTable's `in_memory_bytes`.
/// - `retained_bytes`: every distinct Arrow allocation the stored batches
///   reference, counted once at its full capacity. A zero-copy slice keeps
///   its whole parent buffer alive, and batches decoded from one IPC message
///   share one allocation; both are charged in full, once.
/// - `index_bytes`: the memtable's own structures (primary-key index, key
///   arena, batch list, buffer bookkeeping), at their allocated capacity.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryUsage {
    /// Bytes of row data the stored batches expose (slice-aware).
    pub payload_bytes: usize,
    /// Bytes of Arrow allocations the stored batches keep alive.
    pub retained_bytes: usize,
    /// Bytes of the memtable's own index and bookkeeping.
    pub index_bytes: usize,
}

impl MemoryUsage {
    /// Heap the memtable keeps alive: `retained_bytes + index_bytes`
    /// (`payload_bytes` is contained in `retained_bytes`).
    pub fn total(&self) -> usize {
        self.retained_bytes + self.index_bytes
    }
}

/// Slice-aware size of one array: the buffer windows its rows use
/// (falls back to the full buffer sizes where Arrow cannot slice-measure).
pub fn array_payload_bytes(array: &dyn Array) -> usize {
    let data = array.to_data();
    let views = view_buffers(&data);
    match data.get_slice_memory_size() {
        Ok(n) => n + views,
        Err(_) => data.get_array_memory_size(),
    }
}

/// Variadic data buffers of view arrays, which `get_slice_memory_size` skips.
fn view_buffers(data: &ArrayData) -> usize {
    let own = if matches!(
        data.data_type(),
        arrow_schema::DataType::Utf8View | arrow_schema::DataType::BinaryView
    ) {
        data.buffers().iter().skip(1).map(Buffer::capacity).sum()
    } else {
        0
    };
    own + data.child_data().iter().map(view_buffers).sum::<usize>()
}

/// Slice-aware size of all columns of `batch`.
pub fn batch_payload_bytes(batch: &RecordBatch) -> usize {
    batch
        .columns()
        .iter()
        .map(|c| array_payload_bytes(c.as_ref()))
        .sum()
}

/// Charges each distinct allocation once, identified by the address of the
/// allocation (not of the slice), at its capacity.
#[derive(Debug, Default)]
pub(crate) struct BufferTracker {
    seen: hashbrown::HashSet<usize, foldhash::fast::FixedState>,
    retained: usize,
}

impl BufferTracker {
    /// Charges the allocations of `batch` not seen before.
    pub(crate) fn charge(&mut self, batch: &RecordBatch) {
        for column in batch.columns() {
            self.walk(&column.to_data());
        }
    }

    fn walk(&mut self, data: &ArrayData) {
        for buffer in data.buffers() {
            self.visit(buffer);
        }
        if let Some(nulls) = data.nulls() {
            self.visit(nulls.buffer());
        }
        for child in data.child_data() {
            self.walk(child);
        }
    }

    fn visit(&mut self, buffer: &Buffer) {
        if buffer.capacity() == 0 && buffer.is_empty() {
            return;
        }
        if self.seen.insert(buffer.data_ptr().as_ptr() as usize) {
            self.retained += buffer.capacity().max(buffer.len());
        }
    }

    /// Bytes charged so far.
    pub(crate) fn retained(&self) -> usize {
        self.retained
    }

    /// Heap of the bookkeeping itself.
    pub(crate) fn overhead(&self) -> usize {
        self.seen.allocation_size()
    }
}
