// An OpenID Provider for the gateway's tests: node-oidc-provider (certified) issuing JWT
// access tokens with the client-credentials grant. Its configuration (issuer, port,
// clients, signing keys, audience, token lifetime, extra claims per client) is a JSON file
// written by tests/helpers/oidc.py; restarted with other keys, it rotates them.
import fs from 'node:fs';
import Provider from 'oidc-provider';

const config = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
const provider = new Provider(config.issuer, {
  clients: config.clients,
  jwks: { keys: config.keys },
  features: {
    devInteractions: { enabled: false },
    clientCredentials: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: () => config.audience,
      useGrantedResource: () => true,
      getResourceServerInfo: () => ({
        scope: 'classify',
        audience: config.audience,
        accessTokenTTL: config.ttl,
        accessTokenFormat: 'jwt',
        jwt: { sign: { alg: config.alg } },
      }),
    },
  },
  extraTokenClaims: (ctx, token) => config.claims[token.clientId] || {},
});
provider.listen(config.port, '127.0.0.1', () => console.log(`listening on ${config.issuer}`));
