"""Twilio Programmable Messaging (SMS): ``providers.twilio.backend.TwilioSmsBackend``."""
