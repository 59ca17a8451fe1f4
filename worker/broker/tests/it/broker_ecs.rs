//! The ECS launcher against the local server's ECS API (moto): RunTask with the
//! pool group and a cold-start `USER_ID`, ListTasks/DescribeTasks, StopTask.

use aws_sdk_ecs::types::{ContainerDefinition, LaunchType};
use leasehold_broker::launcher::{EcsLauncher, EcsSettings, TaskLauncher};
use leasehold_testkit::{dynamodb_endpoint, local_sdk_config, unique_name};

fn ecs_client(endpoint: &str) -> aws_sdk_ecs::Client {
    aws_sdk_ecs::Client::new(&local_sdk_config(endpoint))
}

#[tokio::test]
async fn ecs_launcher_starts_lists_and_stops_tasks() {
    // moto serves the ECS API on the same endpoint as DynamoDB.
    let Some(endpoint) = dynamodb_endpoint() else {
        return;
    };
    let client = ecs_client(&endpoint);
    let cluster = unique_name("pool");
    client
        .create_cluster()
        .cluster_name(&cluster)
        .send()
        .await
        .unwrap();
    let family = unique_name("broker-worker");
    client
        .register_task_definition()
        .family(&family)
        .cpu("256")
        .memory("512")
        .container_definitions(
            ContainerDefinition::builder()
                .name("broker-worker")
                .image("leasehold:latest")
                .memory_reservation(512)
                .command("broker-worker")
                .build(),
        )
        .send()
        .await
        .unwrap();
    let group = "leasehold-test-pool".to_owned();
    let launcher = EcsLauncher::new(
        client.clone(),
        EcsSettings {
            cluster: cluster.clone(),
            task_definition: family.clone(),
            container: "broker-worker".into(),
            // moto checks subnets against its EC2 model, which this test does not set up.
            subnets: vec![],
            security_groups: vec![],
            launch_type: LaunchType::Fargate.as_str().into(),
            group,
        },
    );
    let pool_task = launcher.start(None).await.unwrap();
    let user_task = launcher.start(Some("u-ecs")).await.unwrap();
    assert_ne!(pool_task, user_task);
    let mut tasks = launcher.list().await.unwrap();
    tasks.sort_by_key(|t| t.user_id.is_some());
    assert_eq!(tasks.len(), 2, "{tasks:?}");
    assert_eq!(tasks[0].task_id, pool_task);
    assert_eq!(tasks[0].user_id, None, "a pool worker runs with USER_ID=-1");
    assert_eq!(tasks[1].task_id, user_task);
    assert_eq!(tasks[1].user_id.as_deref(), Some("u-ecs"));

    launcher.stop(&pool_task, "test").await.unwrap();
    let left: Vec<String> = launcher
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.task_id)
        .collect();
    assert_eq!(left, vec![user_task]);
}
