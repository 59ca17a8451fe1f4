//! The lease table, read eventually consistent and classified by the one
//! lease-table read model (`leasehold_control::read::LeaseTable`).

use std::time::Duration;

use leasehold_control::read::LeaseTable;
use leasehold_control::store::{Consistency, LeaseReader};

use crate::sources::timed;

/// Scans the whole table in pages of `page_size` within `deadline`.
/// Eventually consistent: the dashboard is a hint, never worth a strong scan.
pub(crate) async fn read(
    reader: &dyn LeaseReader,
    page_size: usize,
    deadline: Duration,
) -> Result<LeaseTable, String> {
    timed(deadline, async {
        LeaseTable::read(reader, page_size, Consistency::Eventual)
            .await
            .map_err(|err| err.to_string())
    })
    .await
}
