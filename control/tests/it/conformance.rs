//! One conformance suite, run against both lease stores (docs/invariants.md, invariant 7).

mod memory {
    leasehold_testkit::conformance_suite!(async {
        Some(leasehold_testkit::lease_store::MemoryTarget::default())
    });
}

mod dynamodb {
    leasehold_testkit::conformance_suite!(leasehold_testkit::lease_store::DynamoTarget::create());
}

/// A table made before assigned discovery (no assignee index) gets the index
/// from `leasehold table create`, and keeps its records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_table_adds_the_assignee_index_to_an_older_table() {
    use aws_sdk_dynamodb::types::{
        AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
    };
    use leasehold_control::schema;
    use leasehold_control::store::dynamodb::{DynamoLeaseStore, TableCreation};
    use leasehold_control::store::{LeaseReader, LeaseStore};

    let Some(endpoint) = leasehold_testkit::dynamodb_endpoint() else {
        return;
    };
    let client = leasehold_testkit::dynamodb_client(&endpoint);
    let table = leasehold_testkit::unique_name("older");
    client
        .create_table()
        .table_name(&table)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name(schema::STREAM_ID)
                .attribute_type(ScalarAttributeType::S)
                .build()
                .unwrap(),
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name(schema::STREAM_ID)
                .key_type(KeyType::Hash)
                .build()
                .unwrap(),
        )
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await
        .unwrap();
    let store = DynamoLeaseStore::new(client.clone(), &table);
    assert!(store.register("old-stream", 1).await.unwrap());
    store.assign("old-stream", Some("w1")).await.unwrap();
    assert!(
        store.assigned("w1").await.is_err(),
        "an older table has no index to query"
    );

    assert_eq!(
        store.create_table().await.unwrap(),
        TableCreation::AlreadyExisted
    );
    assert_eq!(store.assigned("w1").await.unwrap(), ["old-stream"]);
    assert_eq!(
        store.create_table().await.unwrap(),
        TableCreation::AlreadyExisted,
        "idempotent once the index is there"
    );
}
