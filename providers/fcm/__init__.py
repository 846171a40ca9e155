"""Firebase Cloud Messaging HTTP v1 (push) via firebase-admin: ``providers.fcm.backend.FcmPushBackend``.

``providers.fcm.data_keys.data_key_problem``: the push ``data`` keys FCM refuses (and the one the
platform sets itself), checked when a push is accepted; importing it does not import firebase-admin.
"""
