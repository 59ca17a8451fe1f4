//! Operator commands against the configured lease table: `table create` and
//! `leases add / list / show / release`.

use anyhow::anyhow;
use clap::{Args, Subcommand};
use leasehold_control::clock::{Clock, SystemClock};
use leasehold_control::lease::Lease;
use leasehold_control::listing::{render_list, render_one};
use leasehold_control::read;
use leasehold_control::settings::LEASE_TABLE;
use leasehold_control::store::dynamodb::{DynamoLeaseStore, TableCreation};
use leasehold_control::store::{Consistency, LeaseError, LeaseStore, list_all};
use leasehold_platform::settings::process_env;

use crate::Failure;

/// Where the lease table is. Flags override the environment.
#[derive(Debug, Args)]
pub(crate) struct TableArgs {
    /// DynamoDB table holding the leases [env: LEASE_TABLE] [default: websocket-leases]
    #[arg(long, value_name = "NAME")]
    lease_table: Option<String>,
}

impl TableArgs {
    /// Validates the configuration (all problems at once) and opens the store.
    async fn open(&self) -> Result<DynamoLeaseStore, Failure> {
        let lookup = |name: &str| {
            let flag = (name == LEASE_TABLE.name)
                .then(|| self.lease_table.clone())
                .flatten();
            flag.or_else(|| process_env(name))
        };
        Ok(DynamoLeaseStore::for_operator(&lookup).await?)
    }
}

/// `leasehold table …`
#[derive(Debug, Subcommand)]
pub(crate) enum TableCommand {
    /// Create the lease table (PAY_PER_REQUEST, `stream_id` string key); does nothing if it exists.
    Create(TableArgs),
}

/// `leasehold leases …`
#[derive(Debug, Subcommand)]
pub(crate) enum LeasesCommand {
    /// Register streams so workers discover them.
    Add {
        #[command(flatten)]
        table: TableArgs,
        /// Stream ids to register.
        #[arg(required = true, value_name = "STREAM")]
        streams: Vec<String>,
    },
    /// List every lease: owner, fence token, expiry, checkpoint, last update.
    List {
        #[command(flatten)]
        table: TableArgs,
        /// Print JSON (one array) for scripts.
        #[arg(long)]
        json: bool,
        /// Include reserved `leasehold#…` records (observer lease, presence).
        #[arg(long)]
        all: bool,
    },
    /// Show one lease in full.
    Show {
        #[command(flatten)]
        table: TableArgs,
        /// Stream id.
        stream: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Release a lease whoever holds it; its holder stops at its next renew, and
    /// the next owner's higher fence token fences anything it still writes.
    Release {
        #[command(flatten)]
        table: TableArgs,
        /// Stream id.
        stream: String,
        /// Required: this overrides the lease protocol.
        #[arg(long)]
        force: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Runs `leasehold table …`.
pub(crate) async fn table(command: TableCommand) -> Result<(), Failure> {
    match command {
        TableCommand::Create(args) => {
            let store = args.open().await?;
            match store.create_table().await? {
                TableCreation::Created => println!("created lease table {}", store.table()),
                TableCreation::AlreadyExisted => {
                    println!("lease table {} already exists", store.table())
                }
            }
            Ok(())
        }
    }
}

/// Runs `leasehold leases …`.
pub(crate) async fn leases(command: LeasesCommand) -> Result<(), Failure> {
    let now = SystemClock.now_ms();
    match command {
        LeasesCommand::Add { table, streams } => {
            let store = table.open().await?;
            for stream in streams {
                if stream.is_empty() {
                    return Err(anyhow!("stream ids cannot be empty").into());
                }
                if store.register(&stream, now).await? {
                    println!("registered {stream}");
                } else {
                    println!("{stream} already registered (left unchanged)");
                }
            }
            Ok(())
        }
        LeasesCommand::List { table, json, all } => {
            let store = table.open().await?;
            let mut records = list_all(&store, 500, Consistency::Strong).await?;
            read::resolve_sessions(&mut records);
            print!("{}", render_list(records, all, json, now));
            Ok(())
        }
        LeasesCommand::Show {
            table,
            stream,
            json,
        } => {
            let store = table.open().await?;
            let record = read::read_stream(&store, &stream, Consistency::Strong).await;
            print_one(record, json, now)
        }
        LeasesCommand::Release {
            table,
            stream,
            force,
            json,
        } => {
            if !force {
                return Err(anyhow!(
                    "refusing to release {stream:?} without --force: its holder may still be working; \
                     a drained worker releases its own leases"
                )
                .into());
            }
            let store = table.open().await?;
            let record = store.force_release(&stream, now).await;
            print_one(record, json, now)
        }
    }
}

fn print_one(record: Result<Lease, LeaseError>, json: bool, now: i64) -> Result<(), Failure> {
    print!("{}", render_one(record?, json, now));
    Ok(())
}
