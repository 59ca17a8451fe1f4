use super::*;

const REQUEST: &str = r#"{"request_id": "r1", "action": "place_order",
    "account": {"broker_name": "paper", "broker_type": "stock", "simulation": true, "account_id": "A1"},
    "order": {"symbol": "2330", "side": "buy", "quantity": 1, "price": 600.5}}"#;

#[test]
fn an_oversized_request_id_is_read_from_its_head_only_when_plain() {
    let head = br#"{"action": "place_order", "request_id" : "r-77", "order": {"#;
    assert_eq!(sniff_request_id(head).as_deref(), Some("r-77"));
    assert_eq!(sniff_request_id(br#"{"request_id": "a\"b"}"#), None);
    assert_eq!(sniff_request_id(br#"{"request_id": 7}"#), None);
    assert_eq!(sniff_request_id(br#"{"request_id": "unterminated"#), None);
    assert_eq!(sniff_request_id(br#"{"order": {}}"#), None);
    assert_eq!(sniff_request_id(br#"{"request_id": "has space"}"#), None);
}

#[test]
fn the_design_request_parses() {
    let request = parse_request(REQUEST).unwrap();
    assert_eq!(request.request_id, "r1");
    assert_eq!(request.account.broker_name, "paper");
    assert!(request.account.simulation);
    let Action::PlaceOrder(order) = request.action;
    assert_eq!(order.symbol, "2330");
    assert_eq!(order.side, Side::Buy);
    assert_eq!(order.quantity, 1.0);
    assert_eq!(order.price, Some(600.5));
    assert_eq!(request.expires_at, None);
}

#[test]
fn expires_at_is_optional_unix_ms() {
    let with = REQUEST.replace(
        r#""request_id": "r1","#,
        r#""request_id": "r1", "expires_at": 1000,"#,
    );
    let request = parse_request(&with).unwrap();
    assert_eq!(request.expires_at, Some(1000));
    assert!(!request.is_expired(1000));
    assert!(request.is_expired(1001));
    let bad = REQUEST.replace(
        r#""request_id": "r1","#,
        r#""request_id": "r1", "expires_at": "soon","#,
    );
    assert_eq!(
        parse_request(&bad).unwrap_err().error,
        ParseError::BadField {
            field: "expires_at",
            problem: "must be unix milliseconds (a whole number)"
        }
    );
}

#[test]
fn bad_requests_keep_their_id_when_readable() {
    let missing = REQUEST.replace(r#""symbol": "2330", "#, "");
    let err = parse_request(&missing).unwrap_err();
    assert_eq!(err.request_id.as_deref(), Some("r1"));
    assert_eq!(err.error, ParseError::MissingField("order.symbol"));

    let err = parse_request(&REQUEST.replace("place_order", "teleport")).unwrap_err();
    assert_eq!(err.error, ParseError::UnknownAction);

    let err = parse_request(&REQUEST.replace(r#""quantity": 1"#, r#""quantity": -2"#)).unwrap_err();
    assert_eq!(
        err.error.to_string(),
        "field `order.quantity` must be a number greater than 0"
    );

    let err = parse_request("{not json").unwrap_err();
    assert_eq!(err.request_id, None);
    assert!(matches!(err.error, ParseError::NotJson { .. }));

    let err = parse_request(r#"{"action": "place_order"}"#).unwrap_err();
    assert_eq!(
        err,
        InvalidRequest {
            request_id: None,
            error: ParseError::MissingField("request_id")
        }
    );
}

#[test]
fn errors_never_echo_values() {
    let err = parse_request(&REQUEST.replace(r#""side": "buy""#, r#""side": "CANARY-SECRET""#))
        .unwrap_err();
    assert!(!err.to_string().contains("CANARY"), "{err}");
    let err = parse_claim(r#"{"user_id": "u1", "encrypted_credentials": 5, "claim_id": "c", "enqueued_at": "CANARY"}"#)
        .unwrap_err();
    assert!(!err.to_string().contains("CANARY"), "{err}");
}

#[test]
fn claims_parse_and_round_trip() {
    let claim = ClaimMessage {
        user_id: "u1".into(),
        encrypted_credentials: "blob".into(),
        claim_id: "c1".into(),
        enqueued_at: 1_700_000_000_000,
    };
    assert_eq!(parse_claim(&claim.to_json()).unwrap(), claim);
    assert!(!format!("{claim:?}").contains("blob"));
    assert_eq!(
        parse_claim(r#"{"user_id": "u1", "claim_id": "c", "enqueued_at": 1}"#),
        Err(ParseError::MissingField("encrypted_credentials"))
    );
    assert!(
        parse_claim(
            r#"{"user_id": "-1", "encrypted_credentials": "b", "claim_id": "c", "enqueued_at": 1}"#
        )
        .is_err()
    );
    assert_eq!(parse_claim("[]"), Err(ParseError::NotObject));
    let colliding =
        r#"{"user_id": "-1:w7", "encrypted_credentials": "b", "claim_id": "c", "enqueued_at": 1}"#;
    assert!(matches!(
        parse_claim(colliding),
        Err(ParseError::BadField {
            field: "user_id",
            ..
        })
    ));
    assert_eq!(claim_id_of(colliding).as_deref(), Some("c"));
    assert_eq!(claim_id_of("not json"), None);
}

#[test]
fn claim_outcomes_are_the_documented_json() {
    let claimed: Value = serde_json::from_str(&ClaimOutcome::claimed("w1").to_json()).unwrap();
    assert_eq!(
        claimed,
        serde_json::json!({"status": "claimed", "worker_id": "w1"})
    );
    let failed = ClaimOutcome::failed("w1", "boom");
    let json: Value = serde_json::from_str(&failed.to_json()).unwrap();
    assert_eq!(
        json,
        serde_json::json!({"status": "failed", "worker_id": "w1", "error": "boom"})
    );
    assert_eq!(ClaimOutcome::parse(&failed.to_json()), Ok(failed));
    assert!(ClaimOutcome::parse(r#"{"status": "maybe", "worker_id": "w"}"#).is_err());
}

#[test]
fn control_messages() {
    assert_eq!(
        parse_control(r#"{"type": "reload_credentials"}"#),
        Ok(ControlMessage::ReloadCredentials)
    );
    assert_eq!(
        parse_control(r#"{"type": "shutdown"}"#),
        Ok(ControlMessage::Shutdown)
    );
    assert_eq!(
        parse_control(r#"{"type": "reboot"}"#),
        Err(ParseError::UnknownControl)
    );
    assert_eq!(
        parse_control(r#"{}"#),
        Err(ParseError::MissingField("type"))
    );
}

#[test]
fn responses_and_dead_letters_are_the_documented_json() {
    let ok: Value =
        serde_json::from_str(&Response::ok("r1", serde_json::json!({"x": 1})).to_json()).unwrap();
    assert_eq!(
        ok,
        serde_json::json!({"request_id": "r1", "status": "ok", "result": {"x": 1}})
    );
    let err: Value =
        serde_json::from_str(&Response::error("r1", ErrorCode::InDoubt, "boom").to_json()).unwrap();
    assert_eq!(
        err,
        serde_json::json!({"request_id": "r1", "status": "error", "error": "boom", "error_code": "in_doubt"})
    );
    for code in [
        ErrorCode::Expired,
        ErrorCode::InDoubt,
        ErrorCode::Invalid,
        ErrorCode::Broker,
        ErrorCode::Timeout,
        ErrorCode::Overloaded,
        ErrorCode::Duplicate,
    ] {
        assert_eq!(serde_json::to_value(code).unwrap(), code.as_str());
    }
    let dead: Value = serde_json::from_str(&dead_letter("why", "{bad", 5)).unwrap();
    assert_eq!(
        dead,
        serde_json::json!({"reason": "why", "message": "{bad", "at": 5})
    );
    assert_eq!(
        dead_letter_raw("why", b"{bad", 5),
        dead_letter("why", "{bad", 5)
    );
    let raw: Value = serde_json::from_str(&dead_letter_raw("why", b"a\xffb", 6)).unwrap();
    assert_eq!(
        raw,
        serde_json::json!({"reason": "why", "message": "a\u{fffd}b", "message_base64": "Yf9i", "at": 6})
    );
}
