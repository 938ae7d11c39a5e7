"""How strategykit relies on private upstream code without guessing: pinned by fingerprint.

Holds the fingerprints of upstream source code (`fix.fingerprint`), the two records
that pin it, `Fix` (one upstream attribute replaced) and `PinnedAccess` (private code
read, set or called), each checked against the installed code before it acts, and the
TensorFlow and Keras releases supported and checked (`versions`), and Keras 2 (tf_keras)
refused where Keras 3 is expected (`legacy_keras`). The fixes and
accesses themselves, which name the private code, are in `strategykit/upstream/`.
Builds on TensorFlow and Keras only (their versions, for its messages).
"""
