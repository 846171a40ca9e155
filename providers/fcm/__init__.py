"""Firebase Cloud Messaging HTTP v1 (push) via firebase-admin: ``providers.fcm.backend.FcmPushBackend``."""
