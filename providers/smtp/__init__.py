"""Plain SMTP (email) through Django's SMTP backend: ``providers.smtp.backend.SmtpEmailBackend``."""
