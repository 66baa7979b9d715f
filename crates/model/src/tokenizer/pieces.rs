//! Token pieces back to back in one buffer, the storage both tokenizers keep their vocabulary's
//! bytes in: a vocabulary costs its text plus 4 bytes per token, with no allocation per token.

use crate::{Error, Result};

/// Piece `i` is `arena[offsets[i]..offsets[i + 1]]`.
#[derive(Clone, Debug)]
pub(crate) struct Pieces {
    arena: Vec<u8>,
    /// Byte offsets of the pieces in `arena`. (len + 1,)
    offsets: Vec<u32>,
}

impl Pieces {
    /// Room for `n` pieces.
    pub(crate) fn with_capacity(n: usize) -> Pieces {
        let mut offsets = Vec::with_capacity(n + 1);
        offsets.push(0);
        Pieces {
            arena: Vec::new(),
            offsets,
        }
    }

    /// Appends the next piece.
    ///
    /// # Errors
    /// [`Error::Config`] once the pieces add up to 4 GiB or more.
    pub(crate) fn push(&mut self, piece: &[u8]) -> Result<()> {
        self.arena.extend_from_slice(piece);
        let end = u32::try_from(self.arena.len())
            .map_err(|_| Error::Config("the tokenizer's pieces add up to 4 GiB or more".into()))?;
        self.offsets.push(end);
        Ok(())
    }

    /// Gives back the unused capacity of the buffer.
    pub(crate) fn shrink_to_fit(&mut self) {
        self.arena.shrink_to_fit();
    }

    /// Number of pieces.
    pub(crate) fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    /// Piece `id` (empty outside the vocabulary).
    pub(crate) fn get(&self, id: u32) -> &[u8] {
        let i = id as usize;
        match (self.offsets.get(i), self.offsets.get(i.wrapping_add(1))) {
            (Some(&start), Some(&end)) => &self.arena[start as usize..end as usize],
            _ => &[],
        }
    }
}
