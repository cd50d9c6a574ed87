/* Job authentication: the job's id and secret token, and the mutual challenge-response
 * that starts every link. Each side proves knowledge of the token with an HMAC over both
 * fresh nonces, so neither a stranger nor a replay can join the job or pose as a member. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "net_internal.h"

#define LOG_MODULE "auth"
#define NONCE_BYTES 32
#define PROOF_BYTES crypto_auth_hmacsha256_BYTES
/* HELLO: job_id u64 | uid u32 | nonce 32 bytes. */
#define HELLO_BYTES (8 + 4 + NONCE_BYTES)
/* CHALLENGE: nonce 32 bytes | proof 32 bytes. */
#define CHALLENGE_BYTES (NONCE_BYTES + PROOF_BYTES)
/* WELCOME: uid u32. LINKED: the connector's uid u32 again. */
#define WELCOME_BYTES 4
#define LINKED_BYTES 4
/* How long past its deadline the acceptor still waits for LINKED. */
#define LINKED_GRACE_NS ((int64_t)1000000000)

static pthread_once_t sodium_once = PTHREAD_ONCE_INIT;
static int sodium_result = -1;

static void sodium_start(void) { sodium_result = sodium_init() < 0 ? -1 : 0; }

static keel_status auth_ready(void) {
  pthread_once(&sodium_once, sodium_start);
  if (sodium_result == 0) return KEEL_OK;
  KEEL_LOG_E(LOG_MODULE, "libsodium failed to initialise");
  return KEEL_EIO;
}

keel_status keel_auth_generate(keel_auth *auth) {
  keel_status status = auth_ready();
  if (status != KEEL_OK) return status;
  uint64_t job_id = 0;
  /* 0 means "any job" to keel_frame_decode, so it is never a job's id. */
  while (job_id == 0) randombytes_buf(&job_id, sizeof job_id);
  randombytes_buf(auth->token, sizeof auth->token);
  auth->job_id = job_id;
  auth->local_id = 0;
  return KEEL_OK;
}

/* Whole-string unsigned decimal: job ids use all 64 bits, past keel_parse_int's range. */
static keel_status parse_job_id(const char *text, uint64_t *job_id_p) {
  if (text == NULL || *text < '0' || *text > '9') return KEEL_EINVAL;
  errno = 0;
  char *end = NULL;
  unsigned long long value = strtoull(text, &end, 10);
  if (*end != '\0' || errno != 0 || value == 0) return KEEL_EINVAL;
  *job_id_p = value;
  return KEEL_OK;
}

keel_status keel_auth_from_env(keel_auth *auth) {
  const char *job_text = getenv("KEEL_JOB_ID");
  const char *token_text = getenv("KEEL_JOB_TOKEN");
  uint64_t job_id;
  uint8_t token[KEEL_TOKEN_BYTES];
  if (parse_job_id(job_text, &job_id) != KEEL_OK) {
    KEEL_LOG_E(LOG_MODULE, "KEEL_JOB_ID is %s; it must be a non-zero decimal number",
               job_text == NULL ? "missing" : "malformed");
    return KEEL_EINVAL;
  }
  if (keel_hex_decode(token_text, token, sizeof token) != KEEL_OK) {
    KEEL_LOG_E(LOG_MODULE, "KEEL_JOB_TOKEN is %s; it must be %d hex digits",
               token_text == NULL ? "missing" : "malformed", 2 * KEEL_TOKEN_BYTES);
    return KEEL_EINVAL;
  }
  auth->job_id = job_id;
  memcpy(auth->token, token, sizeof token);
  auth->local_id = 0;
  sodium_memzero(token, sizeof token);
  return KEEL_OK;
}

/* HMAC-SHA256(token, label | job_id | first nonce | second nonce). The labels differ by
 * side, so a proof made by one side can never be reflected back as the other's. */
static void auth_proof(const keel_auth *auth, const char *label, const uint8_t *first_nonce,
                       const uint8_t *second_nonce, uint8_t *proof) {
  crypto_auth_hmacsha256_state state;
  uint8_t job_wire[8];
  keel_put_le64(job_wire, auth->job_id);
  crypto_auth_hmacsha256_init(&state, auth->token, sizeof auth->token);
  crypto_auth_hmacsha256_update(&state, (const uint8_t *)label, strlen(label));
  crypto_auth_hmacsha256_update(&state, job_wire, sizeof job_wire);
  crypto_auth_hmacsha256_update(&state, first_nonce, NONCE_BYTES);
  crypto_auth_hmacsha256_update(&state, second_nonce, NONCE_BYTES);
  crypto_auth_hmacsha256_final(&state, proof);
  sodium_memzero(&state, sizeof state);
}

static keel_status handshake_send(keel_link *link, uint16_t type, const void *payload,
                                  size_t length, int64_t deadline_ns) {
  keel_frame frame = {.type = type};
  return keel__link_send_blocking(link, &frame, payload, length, deadline_ns);
}

/* Receives a handshake frame of exactly the expected type and length. */
static keel_status handshake_recv(keel_link *link, uint16_t type, uint8_t *payload, size_t length,
                                  int64_t deadline_ns) {
  uint8_t buffer[KEEL__HANDSHAKE_MAX_PAYLOAD];
  size_t received = 0;
  keel_status status =
      keel__link_recv_into(link, type, buffer, sizeof buffer, &received, deadline_ns);
  if (status != KEEL_OK) return status;
  if (received != length) return KEEL_EPROTO;
  memcpy(payload, buffer, length);
  return KEEL_OK;
}

/* The verdict of a failed handshake, logged once: timeouts stay timeouts, every other
 * failure is an authentication failure, except a connection the acceptor closed (see
 * connector_failed). */
static keel_status handshake_failed(keel_link *link, const char *role, keel_status status) {
  if (status == KEEL_ETIMEDOUT) {
    KEEL_LOG_W(LOG_MODULE, "%s handshake with %s timed out", role, link->peer_address);
    return KEEL_ETIMEDOUT;
  }
  if (status == KEEL_ECLOSED && strcmp(role, "connector") == 0) {
    /* An acceptor refuses by answering with a proof that fails, never by closing (even one
     * of another job answers), so a close on the connector's side is an acceptor that went
     * away: a lost peer, which callers route around, not a wrong token, which ends them. */
    KEEL_LOG_W(LOG_MODULE, "%s went away during the handshake", link->peer_address);
    return KEEL_ECLOSED;
  }
  KEEL_LOG_W(LOG_MODULE, "%s handshake with %s failed: %s", role, link->peer_address,
             keel_strerror(status));
  return KEEL_EAUTH;
}

static void handshake_done(keel_link *link, uint32_t peer_id) {
  link->peer_id = peer_id;
  link->handshaking = false;
  link->max_payload = KEEL_FRAME_DEFAULT_MAX_PAYLOAD;
}

keel_status keel__handshake_connect(keel_link *link, const keel_auth *auth, int64_t deadline_ns) {
  keel_status status = auth_ready();
  if (status != KEEL_OK) return status;
  uint8_t hello[HELLO_BYTES];
  uint8_t *nonce_connector = hello + 12;
  keel_put_le64(hello, auth->job_id);
  keel_put_le32(hello + 8, auth->local_id);
  randombytes_buf(nonce_connector, NONCE_BYTES);
  status = handshake_send(link, KEEL_FRAME_HELLO, hello, sizeof hello, deadline_ns);
  if (status != KEEL_OK) return handshake_failed(link, "connector", status);

  uint8_t challenge[CHALLENGE_BYTES];
  status = handshake_recv(link, KEEL_FRAME_CHALLENGE, challenge, sizeof challenge, deadline_ns);
  if (status != KEEL_OK) return handshake_failed(link, "connector", status);
  const uint8_t *nonce_acceptor = challenge;
  uint8_t expected[PROOF_BYTES];
  auth_proof(auth, "keel-acceptor", nonce_connector, nonce_acceptor, expected);
  if (crypto_verify_32(expected, challenge + NONCE_BYTES) != 0) {
    /* Our proof is never sent to a peer that cannot prove the token itself. */
    KEEL_LOG_W(LOG_MODULE, "the acceptor at %s did not prove job %llu's token (wrong token, "
               "or not a member of this job)", link->peer_address,
               (unsigned long long)auth->job_id);
    return KEEL_EAUTH;
  }

  uint8_t response[PROOF_BYTES];
  auth_proof(auth, "keel-connector", nonce_acceptor, nonce_connector, response);
  status = handshake_send(link, KEEL_FRAME_RESPONSE, response, sizeof response, deadline_ns);
  if (status != KEEL_OK) return handshake_failed(link, "connector", status);

  uint8_t welcome[WELCOME_BYTES];
  status = handshake_recv(link, KEEL_FRAME_WELCOME, welcome, sizeof welcome, deadline_ns);
  if (status != KEEL_OK) return handshake_failed(link, "connector", status);
  /* The acceptor counts the link only once it has this: a connector that gave up waiting for
   * the welcome (its deadline passed on a loaded machine) closes a link that the acceptor
   * would otherwise have counted as made, seen close, and taken for the connector's death. */
  uint8_t linked[LINKED_BYTES];
  keel_put_le32(linked, auth->local_id);
  status = handshake_send(link, KEEL_FRAME_LINKED, linked, sizeof linked, deadline_ns);
  if (status != KEEL_OK) return handshake_failed(link, "connector", status);
  handshake_done(link, keel_get_le32(welcome));
  return KEEL_OK;
}

keel_status keel__handshake_accept(keel_link *link, const keel_auth *auth, int64_t deadline_ns) {
  keel_status status = auth_ready();
  if (status != KEEL_OK) return status;
  uint8_t hello[HELLO_BYTES];
  status = handshake_recv(link, KEEL_FRAME_HELLO, hello, sizeof hello, deadline_ns);
  if (status != KEEL_OK) return handshake_failed(link, "acceptor", status);
  uint32_t peer_id = keel_get_le32(hello + 8);
  const uint8_t *nonce_connector = hello + 12;

  /* A connector of another job gets the challenge too: its proof over this job's id fails
   * there, which the connector reads as a refusal, where a bare close would read as a peer
   * that died. */
  uint8_t challenge[CHALLENGE_BYTES];
  uint8_t *nonce_acceptor = challenge;
  randombytes_buf(nonce_acceptor, NONCE_BYTES);
  auth_proof(auth, "keel-acceptor", nonce_connector, nonce_acceptor, challenge + NONCE_BYTES);
  status = handshake_send(link, KEEL_FRAME_CHALLENGE, challenge, sizeof challenge, deadline_ns);
  if (status != KEEL_OK) return handshake_failed(link, "acceptor", status);
  if (keel_get_le64(hello) != auth->job_id) return handshake_failed(link, "acceptor", KEEL_EPROTO);

  uint8_t response[PROOF_BYTES];
  status = handshake_recv(link, KEEL_FRAME_RESPONSE, response, sizeof response, deadline_ns);
  if (status != KEEL_OK) return handshake_failed(link, "acceptor", status);
  uint8_t expected[PROOF_BYTES];
  auth_proof(auth, "keel-connector", nonce_acceptor, nonce_connector, expected);
  if (crypto_verify_32(expected, response) != 0) {
    KEEL_LOG_W(LOG_MODULE, "a connection from %s failed to prove job %llu's token "
               "(wrong token)", link->peer_address, (unsigned long long)auth->job_id);
    return KEEL_EAUTH;
  }

  uint8_t welcome[WELCOME_BYTES];
  keel_put_le32(welcome, auth->local_id);
  status = handshake_send(link, KEEL_FRAME_WELCOME, welcome, sizeof welcome, deadline_ns);
  if (status != KEEL_OK) return handshake_failed(link, "acceptor", status);
  /* A connector that had the welcome in time counts the link already: a refusal now would
   * close a link it holds. The grace covers a connector descheduled between the two; one
   * that gave up closes, which ends the wait at once. */
  uint8_t linked[LINKED_BYTES];
  status =
      handshake_recv(link, KEEL_FRAME_LINKED, linked, sizeof linked, deadline_ns + LINKED_GRACE_NS);
  if (status != KEEL_OK) return handshake_failed(link, "acceptor", status);
  if (keel_get_le32(linked) != peer_id) return handshake_failed(link, "acceptor", KEEL_EPROTO);
  handshake_done(link, peer_id);
  return KEEL_OK;
}
