//! The lease table itself: creating it (with the assignee index), checking it
//! exists, and the one index `Query` of assigned discovery.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, CreateGlobalSecondaryIndexAction,
    GlobalSecondaryIndex, GlobalSecondaryIndexUpdate, IndexStatus, KeySchemaElement, KeyType,
    Projection, ProjectionType, ScalarAttributeType, TableDescription, TableStatus,
};

use leasehold_platform::iam::dynamodb;

use super::{DynamoLeaseStore, TableCreation, may, rejected, s};
use crate::schema;
use crate::store::LeaseError;

fn key(name: &str, key_type: KeyType) -> Result<KeySchemaElement, LeaseError> {
    KeySchemaElement::builder()
        .attribute_name(name)
        .key_type(key_type)
        .build()
        .map_err(rejected)
}

fn string_attribute(name: &str) -> Result<AttributeDefinition, LeaseError> {
    AttributeDefinition::builder()
        .attribute_name(name)
        .attribute_type(ScalarAttributeType::S)
        .build()
        .map_err(rejected)
}

/// The assignee index's keys: `assignee` (hash), `stream_id` (range).
fn index_keys() -> Result<Vec<KeySchemaElement>, LeaseError> {
    Ok(vec![
        key(schema::ASSIGNEE, KeyType::Hash)?,
        key(schema::STREAM_ID, KeyType::Range)?,
    ])
}

/// Keys only: a worker learns which streams are its own and re-reads the
/// record before acting, so nothing else is worth an index write. Renewals
/// and checkpoints change no key, so they cost the index nothing.
fn keys_only() -> Projection {
    Projection::builder()
        .projection_type(ProjectionType::KeysOnly)
        .build()
}

impl DynamoLeaseStore {
    /// Creates the lease table (PAY_PER_REQUEST, `stream_id` string hash key,
    /// the assignee index) and waits until it is active. Idempotent: on a
    /// table that already exists (an older version's), it adds the assignee
    /// index if missing and waits for it.
    pub async fn create_table(&self) -> Result<TableCreation, LeaseError> {
        let index = GlobalSecondaryIndex::builder()
            .index_name(schema::ASSIGNEE_INDEX)
            .set_key_schema(Some(index_keys()?))
            .projection(keys_only())
            .build()
            .map_err(rejected)?;
        may(&[dynamodb::CREATE_TABLE])?;
        let result = self
            .client
            .create_table()
            .table_name(&self.table)
            .attribute_definitions(string_attribute(schema::STREAM_ID)?)
            .attribute_definitions(string_attribute(schema::ASSIGNEE)?)
            .key_schema(key(schema::STREAM_ID, KeyType::Hash)?)
            .global_secondary_indexes(index)
            .billing_mode(BillingMode::PayPerRequest)
            .send()
            .await;
        let creation = match result {
            Ok(_) => TableCreation::Created,
            Err(err) if err.code() == Some("ResourceInUseException") => {
                TableCreation::AlreadyExisted
            }
            Err(err) => return Err(self.sdk_error(err)),
        };
        let table = self.wait_active().await?;
        let indexed = table
            .global_secondary_indexes()
            .iter()
            .any(|index| index.index_name() == Some(schema::ASSIGNEE_INDEX));
        if creation == TableCreation::AlreadyExisted && !indexed {
            self.add_assignee_index().await?;
            self.wait_active().await?;
        }
        Ok(creation)
    }

    /// Fails with [`LeaseError::TableMissing`] when the table does not exist.
    pub async fn check_table(&self) -> Result<(), LeaseError> {
        self.describe().await.map(|_| ())
    }

    /// The table as DynamoDB describes it (an empty description if it says
    /// nothing more).
    async fn describe(&self) -> Result<TableDescription, LeaseError> {
        may(&[dynamodb::DESCRIBE_TABLE])?;
        let described = self
            .client
            .describe_table()
            .table_name(&self.table)
            .send()
            .await
            .map_err(|err| self.sdk_error(err))?;
        Ok(described
            .table
            .unwrap_or_else(|| TableDescription::builder().build()))
    }

    async fn add_assignee_index(&self) -> Result<(), LeaseError> {
        let create = CreateGlobalSecondaryIndexAction::builder()
            .index_name(schema::ASSIGNEE_INDEX)
            .set_key_schema(Some(index_keys()?))
            .projection(keys_only())
            .build()
            .map_err(rejected)?;
        may(&[dynamodb::UPDATE_TABLE])?;
        self.client
            .update_table()
            .table_name(&self.table)
            .attribute_definitions(string_attribute(schema::STREAM_ID)?)
            .attribute_definitions(string_attribute(schema::ASSIGNEE)?)
            .global_secondary_index_updates(
                GlobalSecondaryIndexUpdate::builder().create(create).build(),
            )
            .send()
            .await
            .map(|_| ())
            .map_err(|err| self.sdk_error(err))
    }

    /// Waits until the table and its assignee index (if any) are active, and
    /// returns it as then described.
    async fn wait_active(&self) -> Result<TableDescription, LeaseError> {
        // A new on-demand table is usually active within seconds, an index
        // added to a large table may take minutes: give up after ten.
        for attempt in 0..600 {
            let table = self.describe().await?;
            let active = table.table_status() == Some(&TableStatus::Active);
            let indexes_active = table.global_secondary_indexes().iter().all(|index| {
                index
                    .index_status()
                    .is_none_or(|s| *s == IndexStatus::Active)
            });
            if active && indexes_active {
                return Ok(table);
            }
            tokio::time::sleep(Duration::from_millis(if attempt < 5 { 200 } else { 1000 })).await;
        }
        Err(LeaseError::Transient {
            message: format!(
                "table {:?} or its {} did not become active within ten minutes",
                self.table,
                schema::ASSIGNEE_INDEX
            ),
        })
    }

    /// Every stream the assignee index lists for `assignee`, page by page.
    pub(super) async fn query_assigned(&self, assignee: &str) -> Result<Vec<String>, LeaseError> {
        let mut streams = Vec::new();
        let mut start: Option<HashMap<String, AttributeValue>> = None;
        loop {
            may(&[dynamodb::QUERY])?;
            let output = self
                .client
                .query()
                .table_name(&self.table)
                .index_name(schema::ASSIGNEE_INDEX)
                .key_condition_expression("#assignee = :assignee")
                .expression_attribute_names("#assignee", schema::ASSIGNEE)
                .expression_attribute_values(":assignee", s(assignee))
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|err| self.sdk_error(err))?;
            streams.extend(output.items().iter().filter_map(
                |item| match item.get(schema::STREAM_ID) {
                    Some(AttributeValue::S(id)) => Some(id.clone()),
                    _ => None,
                },
            ));
            match output.last_evaluated_key {
                Some(key) if !key.is_empty() => start = Some(key),
                _ => return Ok(streams),
            }
        }
    }
}
