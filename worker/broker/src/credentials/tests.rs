use super::*;

const CANARY: &str = "CANARY-7d1f-secret";

#[test]
fn plaintext_is_read_into_one_allocation_up_to_the_limit() {
    let json = br#"{"api_key": "k", "account_id": "A1"}"#;
    // A reader that hands out one byte at a time: many reads, one buffer.
    struct Trickle<'a>(&'a [u8]);
    impl std::io::Read for Trickle<'_> {
        fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
            let Some((first, rest)) = self.0.split_first() else {
                return Ok(0);
            };
            out[0] = *first;
            self.0 = rest;
            Ok(1)
        }
    }
    let read = read_plaintext(Trickle(json)).unwrap();
    assert_eq!(&read[..], json);
    assert_eq!(
        read.capacity(),
        PLAINTEXT_MAX_BYTES + 1,
        "sized once, never grown"
    );
    let exact = vec![b'x'; PLAINTEXT_MAX_BYTES];
    assert_eq!(
        read_plaintext(&exact[..]).unwrap().len(),
        PLAINTEXT_MAX_BYTES
    );
    let over = vec![b'x'; PLAINTEXT_MAX_BYTES + 1];
    assert!(matches!(
        read_plaintext(&over[..]),
        Err(PlaintextError::TooLarge)
    ));
}

fn plaintext() -> String {
    format!(r#"{{"api_key": "{CANARY}", "account_id": "A1"}}"#)
}

#[test]
fn round_trip() {
    let cipher = AesGcmCipher::from_base64_key(&AesGcmCipher::generate_key()).unwrap();
    let blob = cipher.encrypt("u1", plaintext().as_bytes()).unwrap();
    assert!(!blob.contains(CANARY));
    let credentials = cipher.decrypt("u1", &blob).unwrap();
    assert_eq!(credentials.get("api_key").unwrap().expose(), CANARY);
    assert_eq!(credentials.get("account_id").unwrap().expose(), "A1");
    // Fresh nonce per blob.
    assert_ne!(blob, cipher.encrypt("u1", plaintext().as_bytes()).unwrap());
}

#[test]
fn wrong_key_and_other_users_blob_fail() {
    let cipher = AesGcmCipher::from_base64_key(&AesGcmCipher::generate_key()).unwrap();
    let other = AesGcmCipher::from_base64_key(&AesGcmCipher::generate_key()).unwrap();
    let blob = cipher.encrypt("u1", plaintext().as_bytes()).unwrap();
    assert_eq!(other.decrypt("u1", &blob), Err(CipherError::DoesNotDecrypt));
    assert_eq!(
        cipher.decrypt("u2", &blob),
        Err(CipherError::DoesNotDecrypt)
    );
    assert_eq!(cipher.decrypt("u1", "!!"), Err(CipherError::NotBase64));
    assert_eq!(cipher.decrypt("u1", "AAAA"), Err(CipherError::TooShort));
    let not_json = cipher.encrypt("u1", b"[1, 2]").unwrap();
    assert_eq!(
        cipher.decrypt("u1", &not_json),
        Err(CipherError::NotJsonObject)
    );
}

#[test]
fn keys_are_validated_without_echo() {
    let err = AesGcmCipher::from_base64_key("c2hvcnQ=").unwrap_err();
    assert_eq!(err, CipherError::InvalidKey);
    let err = AesGcmCipher::from_base64_key("CANARY not base64").unwrap_err();
    assert!(!err.to_string().contains("CANARY"));
}

#[test]
fn debug_output_redacts_secrets() {
    let cipher = AesGcmCipher::from_base64_key(&AesGcmCipher::generate_key()).unwrap();
    let credentials = cipher
        .decrypt("u1", &cipher.encrypt("u1", plaintext().as_bytes()).unwrap())
        .unwrap();
    let shown = format!(
        "{credentials:?} {:?} {cipher:?}",
        credentials.get("api_key")
    );
    assert!(!shown.contains(CANARY), "{shown}");
    assert!(shown.contains("api_key"), "{shown}");
}

/// The blob format is documented for other languages: check it by hand.
#[test]
fn blob_layout_is_nonce_then_ciphertext_and_tag() {
    let cipher = AesGcmCipher::from_base64_key(&AesGcmCipher::generate_key()).unwrap();
    let blob = cipher.encrypt("u1", b"{}").unwrap();
    let raw = STANDARD.decode(blob).unwrap();
    assert_eq!(raw.len(), NONCE_LEN + 2 + TAG_LEN);
}
