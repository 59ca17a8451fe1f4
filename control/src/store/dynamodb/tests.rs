use super::*;

/// Every attribute an expression names must be a schema constant, so the
/// expressions cannot drift from the one definition of the record.
#[test]
fn expressions_only_name_schema_attributes() {
    let known = [
        schema::STREAM_ID,
        schema::OWNER_ID,
        schema::LEASE_EXPIRES_AT,
        schema::FENCE_TOKEN,
        schema::CHECKPOINT,
        schema::UPDATED_AT,
        schema::ACQUIRED_AT,
        schema::LAST_OWNER,
        schema::PREVIOUS_OWNER,
        schema::PREVIOUS_EXPIRES_AT,
        schema::RELEASED_AT,
        schema::CHECKPOINT_AT,
        schema::SESSION_TOKEN,
        schema::LEASE_MODE,
        schema::ASSIGNEE,
        schema::MAX_STREAMS,
        schema::HANDED_TO,
    ];
    let keywords = [
        "SET",
        "REMOVE",
        "AND",
        "OR",
        "attribute_not_exists",
        "attribute_exists",
        "if_not_exists",
    ];
    for expression in [
        ACQUIRE_CONDITION,
        ACQUIRE_UPDATE,
        RENEW_CONDITION,
        EXPIRY_NOT_SHORTENED,
        CHECKPOINT_NOT_BEHIND,
        RENEW_UPDATE,
        RENEW_CHECKPOINT_UPDATE,
        HOLDER_CONDITION,
        CHECKPOINT_UPDATE,
        RELEASE_UPDATE,
        RELEASE_WITH_CHECKPOINT_UPDATE,
        RECORD_EXISTS,
        RECORD_ABSENT,
        LIFT_CONDITION,
        LIFT_UPDATE,
        BUMP_UPDATE,
        SESSION_ACQUIRE_CONDITION,
        ACQUIRE_SESSION_UPDATE,
        ACQUIRE_PER_STREAM_REMOVE,
        SESSION_ENDED_CONDITION,
        TAKEOVER_CONDITION,
        DECLARE_MODE_UPDATE,
        ASSIGN_UPDATE,
        ACQUIRE_MAX_STREAMS_UPDATE,
        UNASSIGN_UPDATE,
    ] {
        for word in expression.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')) {
            if word.is_empty() || word.starts_with(':') || keywords.contains(&word) {
                continue;
            }
            assert!(
                known.contains(&word),
                "{word:?} in {expression:?} is not a schema attribute"
            );
        }
    }
}

#[test]
fn raw_round_trip_keeps_types() {
    let item = RawItem::from([
        (schema::STREAM_ID.to_owned(), AttrValue::s("a")),
        (schema::FENCE_TOKEN.to_owned(), AttrValue::s("7")),
    ]);
    assert_eq!(to_raw(from_raw(&item)), item);
}
